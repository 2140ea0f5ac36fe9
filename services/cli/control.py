"""``reel cancel`` and ``reel rewind``: the mutating commands (each runs its service in-process if none runs)."""

from __future__ import annotations

import sys
from typing import Any

import msgspec
import typer

from services.cli.common import CliError, Namespace, NatsUrl, err_console, run_async
from services.cli.embed import service_active, session


def _print_reply(reply: Any) -> int:
    if not reply.ok:
        raise CliError(f"{reply.error.code}: {reply.error.message}" if reply.error else "refused")
    sys.stdout.write(msgspec.json.encode(reply).decode() + "\n")
    return 0


def cancel(run_id: str = typer.Argument(...), reason: str = typer.Option("", help="why"),
           nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Cancel a run (legal from Pending, Running and Verifying)."""
    async def body() -> int:
        async with session(nats_url, namespace, services=("cancel",)) as s:
            return _print_reply(await s.client.cancel(run_id, reason))

    run_async(body())


def rewind(
    run_id: str = typer.Argument(...),
    at_step: str | None = typer.Option(None, "--at-step", help="re-run from this step"),
    at_lsn: int | None = typer.Option(None, "--at-lsn", help="fork at this LSN"),
    branch: str | None = typer.Option(None, "--branch", help="branch to fork (default: active)"),
    key: str | None = typer.Option(None, "--key", help="idempotency key"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Fork a new branch of a run at a step or an LSN; execution resumes on it."""
    if (at_step is None) == (at_lsn is None):
        err_console.print("[red]error:[/] give exactly one of --at-step or --at-lsn")
        raise typer.Exit(2)

    async def body() -> int:
        async with session(nats_url, namespace, services=("rewind",)) as s:
            code = _print_reply(await s.client.rewind(run_id, at_step=at_step, at_lsn=at_lsn, branch=branch,
                                                      idempotency_key=key))
            if not await service_active(s.infra, s.cfg, "executor"):
                err_console.print("[dim]no executor is running: the run continues on the new branch when one"
                                  " starts (`reel up`, or `reel serve executor`);"
                                  f" follow it with `reel show {run_id}`[/]")
            return code

    run_async(body())
