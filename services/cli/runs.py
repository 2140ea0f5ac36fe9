"""``reel run``, ``ls``, ``verdicts``: start and follow a run, list runs, print their verdicts (``show``: show.py)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import nats
import typer
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from reel.services.cli import interrupt
from reel.services.cli.console import (
    EXIT,
    CliError,
    Namespace,
    NatsUrl,
    console,
    err_console,
    run_async,
)
from reel.services.cli.embed import SERVICES, Session, session, wait_states
from reel.services.cli.tokens import TokenPrinter
from reel.services.timeline.render import STATUS_STYLE, event_line, print_timeline, print_waiting, verdict_table
from reel.shared.core.errors import RunNotFound
from reel.shared.core.run import timers
from reel.shared.core.run.events import Verdict
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.state import RunState
from reel.shared.core.verify.verification import checks_summary, reported_outcome
from reel.shared.core.workflow.spec import load_workflow
from reel.shared.runtime.clock import now_ms


async def follow(s: Session, run_id: str, *, until: tuple[str, ...], timeout_s: float, quiet: bool = False,
                 history: bool | None = None) -> RunState | None:
    """Print each new commit of ``run_id`` (unless ``quiet``) until its status is in ``until``; ``None`` on timeout.

    While the run sleeps (``sleeping``) the timeout counts from its wake time, not from now.

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
                wake = timers.next_wake(state.status, state.active)
                if wake is not None:  # a sleep does not count against the timeout
                    loop = asyncio.get_running_loop()
                    later = loop.time() + max(0.0, (wake - now_ms()) / 1000) + timeout_s
                    if (when := deadline.when()) is not None and later > when:
                        deadline.reschedule(later)
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
    """The exit code of a finished (or timed-out, ``None``) run: see :data:`reel.services.cli.console.EXIT`."""
    if state is None:
        return EXIT["timeout"]
    if state.status in ("cancelled", "awaiting_input"):
        return EXIT[state.status]
    return EXIT.get(reported_outcome(state) or "", 0)


def run(
    file: Path = typer.Argument(..., help="workflow spec (YAML or JSON, see docs/workflow.md)"),
    key: str | None = typer.Option(None, "--key", help="idempotency key: a repeated start returns the same run"),
    timeout: float = typer.Option(300.0, min=0.1, help="seconds to wait for the run to finish (exit 5); while the run "
                                  "sleeps, counted from its wake time"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines, only the timeline"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Start a run of a workflow, follow its progress, print its timeline and outcome.

    A run that starts waiting for a human (a tool call needing approval, an ``ask_user``
    question) is left waiting: its requests are printed with the commands that answer
    them (``reel approve|reject|answer``, which then follow the run), exit code 6.
    """
    folder = str(file.resolve().parent)  # where the executor looks for the workflow's python tools first

    async def body() -> int:
        spec = load_workflow(file, env=os.environ)  # ${NAME} / ${NAME:-default} from the environment
        async with session(nats_url, namespace, services=SERVICES) as s:
            sent: list[str] = []
            try:
                reply = await s.client.start(spec, idempotency_key=key, source_dir=folder, sending=sent.append)
            except asyncio.CancelledError:
                if sent:  # the command may be queued: it makes this run when an executor takes it
                    interrupt.said()
                    err_console.print(f"interrupted before the start was answered: if it was queued, run {sent[-1]} "
                                      "starts when an executor runs (`reel up`); `reel ls` then lists it and "
                                      f"`reel cancel {sent[-1]}` stops it")
                raise
            if not reply.ok or reply.run_id is None:
                raise CliError(f"start refused: {reply.error.code if reply.error else '?'}: "
                               f"{reply.error.message if reply.error else ''}")
            console.print(f"run [bold]{reply.run_id}[/] {'created' if reply.created else 'already existed'}")
            try:
                state = await follow(s, reply.run_id, until=(*wait_states(), "awaiting_input"), timeout_s=timeout,
                                     quiet=quiet)
            except asyncio.CancelledError:
                interrupt.said()
                if "executor" in s.in_process:  # this command's executor stops with it
                    err_console.print(f"interrupted: run {reply.run_id} is left as it is and resumes when an "
                                      f"executor runs (`reel up`); `reel cancel {reply.run_id}` stops it")
                else:
                    err_console.print(f"interrupted: run {reply.run_id} goes on under the running services; "
                                      f"`reel show {reply.run_id}` shows it, `reel cancel {reply.run_id}` stops it")
                raise
            if state is None:
                goes_on = "is left as it is and resumes when an executor runs (`reel up`)" \
                    if "executor" in s.in_process else "goes on under the running services"
                raise CliError(f"run {reply.run_id} did not finish within {timeout:g}s: it {goes_on}; "
                               f"`reel show {reply.run_id} --follow` follows it", EXIT["timeout"])
            print_timeline(console, state, None, await s.workflow(state))  # as `reel show` prints it
            if state.status == "awaiting_input":
                print_waiting(console, state)
            return exit_code(state)

    run_async(body())


def list_runs(nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """List runs, newest first (by creation time), with status, outcome and context checks.

    The outcome is the reported one: ``unlabelled`` for a
    completed run without an outcome verifier (a recording without a label), whatever its
    context check said; that check has its own column. A corrupt run: ``corrupt``, the LSN
    and kind of its bad commit. Run ids are printed whole at any terminal width (a narrow
    one gets two lines a run).
    """
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            rows: list[tuple[int, str, tuple[str, ...]]] = []
            for rid in await s.client.log.list_runs():
                try:
                    st = await s.client.log.load(rid)
                except RunCorrupt as exc:  # listed with where and why; its state as of the last good commit
                    bad, good = exc.corruption, exc.state
                    rows.append((good.created_ms if good else 0, rid, (
                        good.workflow_name if good else "?", "corrupt", f"at lsn {bad.lsn}: {bad.kind}", "",
                        good.active_branch if good else "", str(good.commits if good else 0), str(bad.lsn),
                        _age(good.created_ms) if good else "")))
                    continue
                rows.append((st.created_ms, rid, (st.workflow_name, st.status, reported_outcome(st) or "",
                                                  checks_summary(st), st.active_branch, str(st.commits),
                                                  str(st.head_lsn), _age(st.created_ms))))
        print_runs(console, [(rid, cells) for _, rid, cells in sorted(rows, key=lambda r: (-r[0], r[1]))])
        return 0

    run_async(body())


RUN_COLUMNS = ("run", "workflow", "status", "outcome", "context check", "branch", "commits", "head lsn", "created")
"""``reel ls``'s columns (one cell each, in this order)."""


TABLE_MIN_COLUMNS = 100
"""Below this terminal width (characters) a ``reel ls`` table that does not fit is printed two lines a run."""


def print_runs(out: Console, rows: list[tuple[str, tuple[str, ...]]]) -> None:
    """``reel ls``'s rows (run id, then the other :data:`RUN_COLUMNS`' cells) as a table whose other cells fold
    where the terminal is narrow; narrower than :data:`TABLE_MIN_COLUMNS` and the table, two lines a run: the run
    id, status and outcome, then the rest, indented and wrapped at word boundaries. A run id is never cut: it is
    what every other command takes. No runs: one line saying so."""
    if not rows:
        out.print("no runs yet in this namespace — start one with `reel run FILE` (or `reel replay FILE…`)",
                  markup=False, highlight=False)
        return
    table = Table()
    for col in RUN_COLUMNS:
        table.add_column(col, no_wrap=col == "run", overflow="fold",
                         min_width=max(len(r) for r, _ in rows) if col == "run" else None)
    for rid, cells in rows:
        table.add_row(*(Text(c) for c in (rid, *cells)))  # cells as written, never Rich markup
    natural = out.measure(table, options=out.options.update_width(10**4)).maximum  # its width, unconstrained
    if out.width >= TABLE_MIN_COLUMNS or natural <= out.width:
        out.print(table)
        return
    for rid, (workflow, status, outcome, checks, branch, commits, head, created) in rows:
        first = Text(rid, style="bold")
        first.append(f"  {status}" + (f"  {outcome}" if outcome else ""), style=STATUS_STYLE.get(status, ""))
        out.print(first, soft_wrap=True)  # never broken by Rich: the terminal wraps it, the id stays one string
        rest = [f"workflow {workflow}", f"context check {checks}" if checks else "", f"branch {branch}" if branch
                else "", f"{commits} commits, head lsn {head}", f"created {created}" if created else ""]
        out.print(Padding(Text(", ".join(x for x in rest if x), style="dim"), (0, 0, 0, 4)))


def _age(created_ms: int) -> str:
    """When a run was created, as a UTC timestamp to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(created_ms / 1000))


def verdicts(
    run_id: str = typer.Argument(...),
    follow_: bool = typer.Option(False, "--follow", "-f", help="print verdicts as they are published until the run "
                                 "completes, is cancelled or awaits input; exit code by its outcome (as reel run)"),
    timeout: float = typer.Option(3600.0, min=0.1,
                                  help="with --follow: seconds to wait for the run to complete (exit 5)"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Print the verdicts published about a run (replayed from the verdict stream).

    With ``--follow`` each verdict is printed as it arrives, and the command ends once the
    run has completed (or was cancelled) and every verdict published so far is printed:
    exit code 0 passed/succeeded/unlabelled, 3 failed or error, 4 cancelled, 5 timeout, 6 awaiting input (the
    open requests and how to answer them are printed).
    """
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            if await s.client.log.first_lsn(run_id) is None:  # a typo: say so rather than wait for verdicts
                raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
            sub = await s.infra.js.subscribe(s.cfg.names.verdict(run_id), ordered_consumer=True)
            try:
                if follow_:
                    return await _follow_verdicts(s, sub, run_id, timeout)
                seen: list[Verdict] = []
                while True:
                    try:
                        msg = await sub.next_msg(timeout=1.0)
                    except nats.errors.TimeoutError:
                        break
                    seen.append(msgspec.json.decode(msg.data, type=Verdict))
                    if msg.metadata.num_pending == 0:
                        break
            finally:
                await sub.unsubscribe()
        console.print(verdict_table(seen) if seen else f"no verdicts about {run_id} yet")
        return 0

    run_async(body())


async def _follow_verdicts(s: Session, sub: Any, run_id: str, timeout_s: float) -> int:
    """Print each verdict as it arrives until the run is done (or rests awaiting input: its open requests are
    printed, exit 6) and the stream drained; the run's exit code."""
    done = asyncio.create_task(s.client.wait_for(run_id, ("completed", "cancelled", "awaiting_input"),
                                                 timeout_s=timeout_s))
    try:
        while True:  # a verdict is published before the commit completing the run: none comes after both
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                if done.done():
                    break
                continue
            console.print(verdict_table([msgspec.json.decode(msg.data, type=Verdict)]))
            if done.done() and msg.metadata.num_pending == 0:
                break
        try:
            state: RunState | None = done.result()
        except TimeoutError:
            state = None
        if state is not None and state.status == "awaiting_input":
            print_waiting(console, state)
        return exit_code(state)
    finally:
        done.cancel()
