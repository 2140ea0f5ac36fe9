"""``reel run``, ``show``, ``ls``, ``verdicts``: start and follow a run, print runs and their verdicts."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import msgspec
import nats
import typer
from rich.table import Table

from services.cli.common import EXIT, CliError, Namespace, NatsUrl, console, err_console, run_async
from services.cli.embed import SERVICES, Session, session, wait_states
from services.cli.tokens import TokenPrinter
from services.timeline import event_line, print_timeline, print_waiting, verdict_table
from shared.core.errors import RunNotFound
from shared.core.events import Verdict
from shared.core.fold import RunState
from shared.core.ids import BranchId
from shared.core.integrity import RunCorrupt
from shared.core.workflow import load_workflow


async def follow(s: Session, run_id: str, *, until: tuple[str, ...], timeout_s: float, quiet: bool = False,
                 history: bool | None = None) -> RunState | None:
    """Print each new commit of ``run_id`` (unless ``quiet``) until its status is in ``until``; ``None`` on timeout.

    Built on :meth:`ReelClient.watch_commits`: without ``quiet`` the run is printed
    from its first commit (``history=False``: from now on), and the tokens of streamed model
    calls as they arrive (services/cli/tokens.py); ``quiet`` loads it snapshot-aware and prints nothing.
    """
    tokens = TokenPrinter(console, s.cfg.names.stream_run(run_id).removesuffix(">"))
    sub = None if quiet else await s.infra.nc.subscribe(s.cfg.names.stream_run(run_id), cb=tokens.on_msg)
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            async for state, commits in s.client.watch_commits(run_id, history=not quiet if history is None
                                                               else history):
                if not quiet:
                    for lsn, commit in commits:
                        for ev in commit.events:
                            tokens.break_line()
                            console.print(event_line(lsn, ev))
                if state.status in until:
                    return state
    except TimeoutError:
        if deadline.expired():
            return None
        raise
    finally:
        tokens.break_line()
        if sub is not None:
            await sub.unsubscribe()
    raise AssertionError("unreachable: watch_commits never ends")


def exit_code(state: RunState | None) -> int:
    """The exit code of a finished (or timed-out, ``None``) run: see :data:`services.cli.common.EXIT`."""
    if state is None:
        return EXIT["timeout"]
    if state.status in ("cancelled", "awaiting_input"):
        return EXIT[state.status]
    return EXIT.get(state.outcome or "", 0)


def run(
    file: Path = typer.Argument(..., help="workflow spec (YAML or JSON, see docs/workflow.md)"),
    key: str | None = typer.Option(None, "--key", help="idempotency key: a repeated start returns the same run"),
    timeout: float = typer.Option(300.0, help="seconds to wait for the run to finish"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines, only the timeline"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Start a run of a workflow, follow its progress, print its timeline and outcome.

    A run that starts waiting for a human (a tool call needing approval, an ``ask_user``
    question) is left waiting: its requests are printed with the commands that answer
    them (``reel approve|reject|answer``, which then follow the run), exit code 6.
    """
    async def body() -> int:
        spec = load_workflow(file, env=os.environ)  # ${NAME} / ${NAME:-default} from the environment
        async with session(nats_url, namespace, services=SERVICES) as s:
            reply = await s.client.start(spec, idempotency_key=key)
            if not reply.ok or reply.run_id is None:
                raise CliError(f"start refused: {reply.error.code if reply.error else '?'}: "
                               f"{reply.error.message if reply.error else ''}")
            console.print(f"run [bold]{reply.run_id}[/] {'created' if reply.created else 'already existed'}")
            try:
                state = await follow(s, reply.run_id, until=(*wait_states(), "awaiting_input"), timeout_s=timeout,
                                     quiet=quiet)
            except asyncio.CancelledError:
                err_console.print(f"interrupted: run {reply.run_id} is left as it is and resumes when an executor "
                                  f"runs (`reel up`); `reel cancel {reply.run_id}` stops it")
                raise
            if state is None:
                raise CliError(f"run {reply.run_id} did not finish within {timeout}s", EXIT["timeout"])
            print_timeline(console, state)
            if state.status == "awaiting_input":
                print_waiting(console, state)
            return exit_code(state)

    run_async(body())


def show(
    run_id: str = typer.Argument(..., help="the run id"),
    branch: str | None = typer.Option(None, help="branch to show (default: the active one)"),
    json_out: bool = typer.Option(False, "--json", help="print the EpisodeView as JSON"),
    follow_: bool = typer.Option(False, "--follow", "-f", help="print its commits, and streamed tokens as they "
                                 "arrive, until it rests; then the timeline"),
    timeout: float = typer.Option(3600.0, help="with --follow: seconds to wait for the run to rest"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Print a run's timeline: steps, attempts with status, partition sizes, usage, LSNs, branches, verdicts."""
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            state = await s.client.log.load(run_id)
            if follow_:
                rested = await follow(s, run_id, until=("verifying", "completed", "cancelled"), timeout_s=timeout)
                if rested is None:
                    raise CliError(f"run {run_id} did not rest within {timeout}s", EXIT["timeout"])
                state = rested
        if branch is not None and branch not in state.branches:
            raise CliError(f"run {run_id} has no branch {branch!r} (branches: {', '.join(state.branches)})")
        if json_out:
            from shared.core.views import build_episode_view, serialize_view

            sys.stdout.write(serialize_view(build_episode_view(state, BranchId(branch) if branch else None)).decode()
                             + "\n")
        else:
            print_timeline(console, state, branch)
        return 0

    run_async(body())


def list_runs(nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """List runs with their status and outcome (a corrupt run: ``corrupt``, the LSN and kind of its bad commit)."""
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            table = Table()
            for col in ("run", "workflow", "status", "outcome", "branch", "commits", "head lsn"):
                table.add_column(col)
            for rid in await s.client.log.list_runs():
                try:
                    st = await s.client.log.load(rid)
                except RunCorrupt as exc:  # listed with where and why; its state as of the last good commit
                    bad, good = exc.corruption, exc.state
                    table.add_row(rid, good.workflow_name if good else "?", "corrupt", f"at lsn {bad.lsn}: {bad.kind}",
                                  good.active_branch if good else "", str(good.commits if good else 0), str(bad.lsn))
                    continue
                table.add_row(rid, st.workflow_name, st.status, st.outcome or "", st.active_branch,
                              str(st.commits), str(st.head_lsn))
        console.print(table)
        return 0

    run_async(body())


def verdicts(
    run_id: str = typer.Argument(...),
    follow_: bool = typer.Option(False, "--follow", "-f", help="keep printing new verdicts"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Print the verdicts published about a run (replayed from the verdict stream)."""
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            if await s.client.log.first_lsn(run_id) is None:  # a typo: say so rather than wait for verdicts
                raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
            subject = s.cfg.names.verdict(run_id)
            seen: list[Verdict] = []
            sub = await s.infra.js.subscribe(subject, ordered_consumer=True)
            try:
                while True:
                    try:
                        msg = await sub.next_msg(timeout=1.0 if not follow_ else 3600)
                    except nats.errors.TimeoutError:
                        if not follow_:
                            break
                        continue
                    v = msgspec.json.decode(msg.data, type=Verdict)
                    seen.append(v)
                    if follow_:
                        console.print(verdict_table([v]))
                    elif msg.metadata.num_pending == 0:
                        break
            finally:
                await sub.unsubscribe()
        if not follow_:
            if not seen:
                console.print(f"no verdicts about {run_id} yet")
            else:
                console.print(verdict_table(seen))
        return 0

    run_async(body())
