"""``reel replay``: recorded agent trajectories as Reel runs (docs/trajectories.md)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import typer
from rich.table import Table

from services.cli.common import CliError, Namespace, NatsUrl, console, run_async
from services.cli.embed import SERVICES, Session, session, wait_states
from services.cli.runs import exit_code, follow
from services.timeline import print_timeline
from shared.core.fold import RunState
from shared.core.workflow import WorkflowSpec, encode_workflow


def replay(
    files: list[Path] = typer.Argument(..., help="recorded trajectory files (mini-swe-agent, SWE-agent, …)"),
    budget_tokens: int = typer.Option(8000, help="context budget of each model step (tokens)"),
    limit: int | None = typer.Option(None, help="at most this many episodes per file"),
    fresh: bool = typer.Option(False, help="start new runs even if these recordings were replayed before"),
    timeout: float = typer.Option(600.0, help="seconds to wait for each run"),
    timelines: bool | None = typer.Option(None, help="print each run's timeline (default: when ≤ 10 runs)"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Replay recorded agent trajectories as Reel runs; print each run's timeline and verdicts."""
    from shared.core.trajectories import load_trajectories

    async def body() -> int:
        specs: list[tuple[Path, WorkflowSpec]] = []
        for f in files:
            specs += [(f, w) for w in load_trajectories(f, budget_tokens=budget_tokens, limit=limit)]
        show = timelines if timelines is not None else len(specs) <= 10
        async with session(nats_url, namespace, services=SERVICES) as s:
            results = await _replay_all(s, specs, fresh=fresh, wait_s=timeout, show=show)
        _replay_summary(results)
        return max((exit_code(st) for _, _, st in results), default=0)

    run_async(body())


async def _replay_all(s: Session, specs: list[tuple[Path, WorkflowSpec]], *, fresh: bool, wait_s: float,
                      show: bool) -> list[tuple[Path, str, RunState | None]]:
    until = wait_states()
    started: list[tuple[Path, str, float]] = []
    for path, spec in specs:
        digest = hashlib.sha256(encode_workflow(spec)).hexdigest()[:32]
        key = f"replay:{digest}" + (f":{time.time_ns()}" if fresh else "")
        reply = await s.client.start(spec, idempotency_key=key, labels={"replayed_from": path.name})
        if not reply.ok or reply.run_id is None:
            raise CliError(f"{path}: start refused: {reply.error.message if reply.error else '?'}")
        started.append((path, reply.run_id, time.perf_counter()))
        console.print(f"[dim]{path.name}[/] {spec.name}: run [bold]{reply.run_id}[/]"
                      f" ({len(spec.steps)} steps{'' if reply.created else ', replayed before'})")
    results: list[tuple[Path, str, RunState | None]] = []
    for path, run_id, t0 in started:
        state = await follow(s, run_id, until=until, timeout_s=wait_s, quiet=True)
        if show and state is not None:
            print_timeline(console, state)
            console.print(f"[dim]{state.commits} commits, {time.perf_counter() - t0:.2f} s since start[/]\n")
        results.append((path, run_id, state))
    return results


def _replay_summary(results: list[tuple[Path, str, RunState | None]]) -> None:
    table = Table(title="replayed runs", title_justify="left")
    for col in ("file", "workflow", "run", "status", "outcome", "steps", "commits", "verdicts"):
        table.add_column(col, overflow="fold")
    for path, run_id, st in results:
        if st is None:
            table.add_row(path.name, "?", run_id, "timeout", "", "", "", "")
            continue
        verdicts = ", ".join(f"{v.verifier}={v.status}" for v in st.verdicts) or "-"
        table.add_row(path.name, st.workflow_name, run_id, st.status, st.outcome or "", str(len(st.steps)),
                      str(st.commits), verdicts)
    console.print(table)
