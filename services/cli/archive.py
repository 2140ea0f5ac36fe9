"""``reel archive``, ``import``, ``pin``, ``unpin``, ``gc``: retention and archives (docs/operations.md, "Retention
and archives"; the file format: :mod:`reel.shared.nats.archive`).

They purge streams, which only the operator may do when auth is on: run them on an auth-off server or as
``reel --auth DIR …`` (a client role is refused with ``permission_denied``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import typer

from reel.services.cli.console import JsonOut, Namespace, NatsUrl, console, run_async
from reel.services.cli.embed import session
from reel.shared.core.run.retention import RetentionPolicy
from reel.shared.nats import archive as archives
from reel.shared.nats import retention
from reel.shared.runtime.clock import now_ms


def archive(run_ids: list[str] = typer.Argument(..., help="finished runs (completed or cancelled)"),
            out: Path = typer.Option(..., "-o", "--output", help="the archive file to write (a tar)"),
            keep: bool = typer.Option(False, "--keep", help="write the file but leave the runs in the hot streams"),
            json_out: bool = JsonOut, nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Write finished runs (commits, verdicts, every blob they reference) to one file, then purge them: `reel ls`
    no longer lists them; `reel import FILE` brings them back."""
    async def body() -> int:
        async with session(nats_url, namespace, role="operator") as s:
            manifest = await archives.archive_runs(s.infra, s.cfg.names, run_ids, out, now_ms=now_ms(),
                                                   purge=not keep)
        if json_out:
            sys.stdout.write(msgspec.json.encode(manifest).decode() + "\n")
            return 0
        blobs = {sha for r in manifest.runs for sha in r.blobs}
        console.print(f"archived {len(manifest.runs)} run(s), {sum(r.commits for r in manifest.runs)} commits, "
                      f"{len(blobs)} blobs to {out}"
                      + ("; kept in the streams" if keep else "; purged from the streams"),
                      markup=False, highlight=False)
        return 0

    run_async(body(), json_out=json_out)


def import_(file: Path = typer.Argument(..., help="an archive written by `reel archive`"),
            json_out: bool = JsonOut, nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Bring the runs of an archive back (their blobs, commits and verdicts); a run that exists here is refused."""
    async def body() -> int:
        async with session(nats_url, namespace, role="operator") as s:
            done = await archives.import_archive(s.infra, s.cfg.names, file)
        if json_out:
            sys.stdout.write(msgspec.json.encode([{"run_id": r, "head_lsn": h} for r, h in done]).decode() + "\n")
            return 0
        for run_id, head in done:
            console.print(f"imported {run_id} (head lsn {head})", markup=False, highlight=False)
        return 0

    run_async(body(), json_out=json_out)


def pin(run_id: str = typer.Argument(...), by: str = typer.Option("", "--by", help="who pins"),
        nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Keep a run whatever the retention policy says (until `reel unpin`)."""
    async def body() -> int:
        async with session(nats_url, namespace, role="operator") as s:
            await retention.pin(s.infra, s.cfg.names, run_id, by=by)
        console.print(f"pinned {run_id}", markup=False, highlight=False)
        return 0

    run_async(body())


def unpin(run_id: str = typer.Argument(...), nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Let the retention policy drop a run again."""
    async def body() -> int:
        async with session(nats_url, namespace, role="operator") as s:
            await retention.unpin(s.infra, s.cfg.names, run_id)
        console.print(f"unpinned {run_id}", markup=False, highlight=False)
        return 0

    run_async(body())


def gc(keep_days: float | None = typer.Option(None, "--keep-days", help="drop finished runs older than this"),
       keep_newest: int | None = typer.Option(None, "--keep-newest", help="keep the newest N finished runs"),
       grace_s: float = typer.Option(retention.DEFAULT_GRACE_S, "--grace-s",
                                     help="never collect a blob younger than this (s)"),
       json_out: bool = JsonOut, nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """One retention sweep now: drop the finished runs the policy lets go (none without --keep-days or
    --keep-newest), then delete the blobs no kept run references."""
    async def body() -> int:
        async with session(nats_url, namespace, role="operator") as s:
            report = await retention.sweep(s.infra, s.cfg.names, RetentionPolicy(keep_days, keep_newest),
                                           now_ms=now_ms(), grace_s=grace_s)
        if json_out:
            sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
            return 0
        console.print(f"{report.runs} runs ({report.pinned} pinned): dropped {len(report.dropped)}; "
                      f"{report.blobs} blobs: deleted {report.deleted}, kept by the guard {report.saved_by_guard}",
                      markup=False, highlight=False)
        return 0

    run_async(body(), json_out=json_out)
