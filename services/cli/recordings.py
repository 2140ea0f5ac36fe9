"""``reel replay``: recorded agent trajectories as Reel runs (docs/trajectories.md)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import typer
from rich.table import Table

from reel.services.cli.console import CliError, Namespace, NatsUrl, console, err_console, run_async
from reel.services.cli.embed import SERVICES, Session, session, wait_states
from reel.services.cli.runs import exit_code, follow
from reel.services.timeline.render import print_timeline
from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.run.state import RunState
from reel.shared.core.verify.verification import checks_summary, context_checks, final_verdicts, reported_outcome
from reel.shared.core.workflow.spec import WorkflowSpec, encode_workflow


def replay(
    files: list[Path] = typer.Argument(..., help="recorded trajectory files (mini-swe-agent, SWE-agent, …)"),
    budget_tokens: int = typer.Option(8000, help="context budget of each model step (tokens)"),
    limit: int | None = typer.Option(None, help="at most this many episodes per file"),
    fresh: bool = typer.Option(False, help="start new runs even if these recordings were replayed before"),
    timeout: float = typer.Option(600.0, min=0.1, help="seconds to wait for each run"),
    timelines: bool | None = typer.Option(None, help="print each run's timeline (default: when ≤ 10 runs)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no per-run lines or timelines: only the summary"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Replay recorded agent trajectories as Reel runs; print each run's timeline and verdicts, then a summary.

    Every readable file is replayed; an unreadable one (not a trajectory, a format it
    does not match, …) is reported with its reason and the command exits 1 at the end
    (else the usual codes: the worst run's). The outcome column is the run's outcome
    verifier (``recorded_outcome`` where the recording has a label), ``unlabelled``
    without one; the context check (``task-in-final-context``) has its own column.
    """
    from reel.shared.core.trajectories import load_trajectories

    async def body() -> int:
        specs: list[tuple[Path, WorkflowSpec]] = []
        unreadable: list[tuple[Path, str]] = []
        for f in files:
            try:
                specs += [(f, w) for w in load_trajectories(f, budget_tokens=budget_tokens, limit=limit)]
            except TrajectoryFormatError as exc:
                unreadable.append((f, exc.message))
                err_console.print(f"[red]unreadable:[/] {exc.message}", markup=True, highlight=False)
        show = not quiet and (timelines if timelines is not None else len(specs) <= 10)
        results: list[tuple[Path, str, RunState | None]] = []
        if specs:
            async with session(nats_url, namespace, services=SERVICES) as s:
                results = await _replay_all(s, specs, fresh=fresh, wait_s=timeout, show=show, quiet=quiet)
        _replay_summary(results, unreadable)
        code = max((exit_code(st) for _, _, st in results), default=0)
        if unreadable:
            rest = "; the others were replayed" if len(unreadable) < len(files) else ""
            err_console.print(f"[red]error:[/] {len(unreadable)} of {len(files)} file"
                              f"{'s' * (len(files) != 1)} unreadable (listed above){rest}")
            return 1
        return code

    run_async(body())


def replay_key(spec: WorkflowSpec, *, fresh: bool = False) -> str:
    """The idempotency key a replay of ``spec`` starts with: the same recording at the same budget is the same
    run (``replayed before``) unless ``fresh``, for ``reel replay`` and ``reel lab`` alike."""
    digest = hashlib.sha256(encode_workflow(spec)).hexdigest()[:32]
    return f"replay:{digest}" + (f":{time.time_ns()}" if fresh else "")


async def _replay_all(s: Session, specs: list[tuple[Path, WorkflowSpec]], *, fresh: bool, wait_s: float,
                      show: bool, quiet: bool) -> list[tuple[Path, str, RunState | None]]:
    until = wait_states()
    started: list[tuple[Path, str, float]] = []
    for path, spec in specs:
        reply = await s.client.start(spec, idempotency_key=replay_key(spec, fresh=fresh),
                                     labels={"replayed_from": path.name})
        if not reply.ok or reply.run_id is None:
            raise CliError(f"{path}: start refused: {reply.error.message if reply.error else '?'}")
        started.append((path, reply.run_id, time.perf_counter()))
        if not quiet:
            console.print(f"[dim]{path.name}[/] {spec.name}: run [bold]{reply.run_id}[/]"
                          f" ({len(spec.steps)} steps{'' if reply.created else ', replayed before'})")
    results: list[tuple[Path, str, RunState | None]] = []
    for path, run_id, t0 in started:
        state = await follow(s, run_id, until=until, timeout_s=wait_s, quiet=True)
        if show and state is not None:
            print_timeline(console, state, None, await s.workflow(state))
            console.print(f"[dim]{state.commits} commits, {time.perf_counter() - t0:.2f} s since start[/]\n")
        results.append((path, run_id, state))
    return results


def _replay_summary(results: list[tuple[Path, str, RunState | None]], unreadable: list[tuple[Path, str]]) -> None:
    table = Table(title="replayed runs", title_justify="left")
    for col in ("file", "workflow", "run", "status", "outcome", "context check", "steps", "commits", "verdicts"):
        table.add_column(col, overflow="fold", no_wrap=col in ("run", "status"))  # a run id, a status: whole
    for path, run_id, st in results:
        if st is None:
            table.add_row(path.name, "?", run_id, "timeout", "", "", "", "", "")
            continue
        checks = set(context_checks(st))
        verdicts = ", ".join(f"{v.verifier}={v.status}" for v in final_verdicts(st).values()
                             if v.verifier not in checks) or "-"
        table.add_row(path.name, st.workflow_name, run_id, st.status, reported_outcome(st) or "",
                      checks_summary(st) or "-", str(len(st.steps)), str(st.commits), verdicts)
    for path, _ in unreadable:
        table.add_row(path.name, "", "", "unreadable", "", "", "", "", "")
    console.print(table)
