"""``reel lab SPEC``: one edit at one point, forked into many runs, judged before and after (docs/forks.md).

The decisions are pure (:mod:`reel.shared.core.lab`: the SPEC, each run's fork plan and its verdicts, the tally);
this module drives them: it replays the SPEC's recordings (as ``reel replay`` starts them, with keys of its own:
a lab never forks the runs ``reel replay`` made, so they keep their active branch) or reads
the runs it names, forks each through the rewind service's command (``ReelClient.rewind`` with the edit, as
``reel fork`` sends it), waits for each fork to rest, and prints the report. At most ``--concurrency`` runs
are in flight at once. Every fork is a branch of its run: ``reel show RUN --branch B``, ``reel compare RUN``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from pathlib import Path

import msgspec
import typer
from rich.table import Table
from rich.text import Text

from reel.services.cli.console import CliError, Namespace, NatsUrl, console, err_console, run_async
from reel.services.cli.embed import SERVICES, Session, session
from reel.services.cli.recordings import replay_key
from reel.shared.core.errors import RunNotFound, TrajectoryFormatError
from reel.shared.core.lab import point as pt
from reel.shared.core.lab import tally as ty
from reel.shared.core.lab.labspec import LabSpec, LabSpecError, describe_point, describe_template, parse_spec
from reel.shared.core.lab.plan import base_branch, judge_fork, plan_fork
from reel.shared.core.run.state import RunState, RunStatus
from reel.shared.core.workflow.spec import WorkflowSpec

RESTING = (RunStatus.COMPLETED, RunStatus.CANCELLED)
STOPPED = (*RESTING, RunStatus.AWAITING_INPUT)
"""Where a lab stops waiting for a fork: at rest, or waiting for a person (it goes on when answered)."""
LAB_BY = "reel lab"
"""Who the lab's forks are recorded as forked by (``branch_forked.by``)."""


class Subject(msgspec.Struct, frozen=True, kw_only=True):
    """A run the lab forks: an existing run (``run_id``) or a recording to replay first (``spec``)."""

    source: str
    run_id: str | None = None
    spec: WorkflowSpec | None = None


def load_spec(path: Path) -> LabSpec:
    """The SPEC at ``path``. Raises: CliError (exit 1): unreadable or invalid, naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read lab SPEC {str(path)!r}: {exc.strerror or exc}", kind="lab_spec") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot read lab SPEC {str(path)!r}: not UTF-8 text (byte {exc.start})",
                       kind="lab_spec") from None
    try:
        return parse_spec(text, folder=path.parent, env=os.environ, name=path.stem)
    except LabSpecError as exc:
        raise CliError(f"{path}: {exc.message}", kind="lab_spec") from None


def recordings(spec: LabSpec) -> list[Subject]:
    """The recordings the SPEC names, loaded (pure), the SPEC's ``limit`` applied. A file in the folder that is
    not a recording (a companion report, a README) is said on stderr and left out.

    Raises:
        CliError: the folder does not exist, or holds no recording.
    """
    from reel.shared.core.trajectories import load_trajectories

    where = spec.runs.recordings
    assert where is not None
    if not where.exists():
        raise CliError(f"recordings {str(where)!r}: no such file or folder", kind="lab_spec")
    files = sorted(p for p in where.iterdir() if p.is_file() and not p.name.startswith(".")) if where.is_dir() \
        else [where]
    out: list[Subject] = []
    for f in files:
        try:
            out += [Subject(source=f.name, spec=w) for w in load_trajectories(f, budget_tokens=spec.runs.budget_tokens)]
        except TrajectoryFormatError as exc:
            err_console.print(f"[dim]not a recording, left out: {exc.message[:200]}[/]", highlight=False)
        if spec.runs.limit is not None and len(out) >= spec.runs.limit:
            break
    if not out:
        raise CliError(f"recordings {str(where)!r}: no recording found", kind="lab_spec")
    return out[:spec.runs.limit]


async def existing(s: Session, spec: LabSpec) -> list[Subject]:
    """The runs the SPEC names by id, or by label (every run whose labels have it), oldest first."""
    if spec.runs.ids:
        return [Subject(source="", run_id=r) for r in spec.runs.ids[:spec.runs.limit]]
    assert spec.runs.label is not None
    key, value = spec.runs.label
    found: list[tuple[int, str, str]] = []
    for rid in await s.client.log.list_runs():
        st = await s.client.log.load(rid)
        if key in st.labels and (value is None or st.labels[key] == value):
            found.append((st.created_ms, rid, st.workflow_name))
    return [Subject(source=name, run_id=rid) for _, rid, name in sorted(found)][:spec.runs.limit]


async def rested(s: Session, run_id: str, *, branch: str | None, verifiers: tuple[str, ...], timeout_s: float
                 ) -> RunState | None:
    """The run once it rests (``branch``: on that branch, or with a verdict of every verifier there; or waits
    for input there); ``None`` at the timeout."""
    def done(st: RunState) -> bool:
        if st.status not in (RESTING if branch is None else STOPPED):
            return False
        if branch is None or st.active_branch == branch:
            return True
        if st.status not in RESTING:
            return False
        have = {v.verifier for v in st.verdicts if v.branch_id == branch}
        return all(v in have for v in verifiers)

    async def wait() -> RunState:
        async for st in s.client.watch(run_id, poll_s=0.1):
            if done(st):
                return st
        raise AssertionError("unreachable: watch never ends")

    try:
        return await asyncio.wait_for(wait(), timeout_s)
    except TimeoutError:
        return None


class Lab:
    """One lab's driving: the SPEC, its session, its fork key, and the progress it prints."""

    def __init__(self, s: Session, spec: LabSpec, *, key: str, timeout_s: float) -> None:
        self.s, self.spec, self.key, self.timeout_s = s, spec, key, timeout_s

    def say(self, text: str) -> None:
        err_console.print(text, markup=False, highlight=False)

    async def run_one(self, subject: Subject) -> ty.RunResult:
        """Replay (if a recording), fork and judge one run; a :class:`RunResult` whatever happens to it."""
        run_id = subject.run_id
        if subject.spec is not None:
            reply = await self.s.client.start(subject.spec, idempotency_key=f"{replay_key(subject.spec)}:lab",
                                              labels={"replayed_from": subject.source, "lab": self.spec.name})
            if not reply.ok or reply.run_id is None:
                why = reply.error.message if reply.error else "refused"
                return ty.RunResult(run_id="", source=subject.source, skipped=f"replay refused: {why}")
            run_id = reply.run_id
        assert run_id is not None
        try:
            state = await rested(self.s, run_id, branch=None, verifiers=(), timeout_s=self.timeout_s) \
                if subject.spec is not None else await self.s.client.log.load(run_id)
        except RunNotFound:
            return ty.RunResult(run_id=run_id, source=subject.source, skipped="no such run")
        if state is None or state.status not in RESTING:
            return ty.RunResult(run_id=run_id, source=subject.source,
                                skipped=f"not at rest ({state.status if state else 'timeout'}): nothing to judge")
        return await self._fork(subject.source or state.workflow_name, state)

    async def _fork(self, source: str, state: RunState) -> ty.RunResult:
        skip = ty.RunResult(run_id=state.run_id, source=source, base_branch=base_branch(state, self.spec))
        plan = plan_fork(state, self.spec, await self.s.workflow(state))
        if isinstance(plan, pt.Skip):
            return msgspec.structs.replace(skip, skipped=plan.reason)
        t0 = time.perf_counter()
        reply = await self.s.client.rewind(state.run_id, at_step=plan.turn, branch=plan.base, edits=(plan.edit,),
                                           by=LAB_BY, idempotency_key=f"{self.key}:{state.run_id}")
        if not reply.ok or reply.branch_id is None:
            why = f"{reply.error.code}: {reply.error.message}" if reply.error else "refused"
            return msgspec.structs.replace(skip, at_step=plan.turn, skipped=f"fork refused: {why}")
        branch = reply.branch_id
        self.say(f"forked {state.run_id} at {plan.turn}: {branch}" + ("" if reply.created is not False
                                                                      else " (before)"))
        rest = await rested(self.s, state.run_id, branch=branch, verifiers=plan.verifiers, timeout_s=self.timeout_s)
        done = msgspec.structs.replace(skip, branch_id=branch, at_step=plan.turn, before=plan.before,
                                       before_usage=plan.before_usage, wall_s=round(time.perf_counter() - t0, 3))
        if rest is None:
            return msgspec.structs.replace(done, skipped=f"the fork did not rest within {self.timeout_s:g} s")
        if rest.status == RunStatus.AWAITING_INPUT and rest.active_branch == branch:
            return msgspec.structs.replace(done, skipped="the fork waits for input (reel pending); it is not judged")
        judged = judge_fork(rest, plan, branch)
        if isinstance(judged, pt.Skip):
            return msgspec.structs.replace(done, skipped=judged.reason)
        self.say(f"finished {state.run_id} {branch}: {plan.before} -> {judged[0]}")
        return msgspec.structs.replace(done, after=judged[0], after_usage=judged[1])


async def drive(s: Session, spec: LabSpec, subjects: list[Subject], *, key: str, concurrency: int,
                timeout_s: float) -> list[ty.RunResult]:
    """Every subject replayed (if a recording), forked and judged, at most ``concurrency`` at once, in order."""
    lab = Lab(s, spec, key=key, timeout_s=timeout_s)
    gate = asyncio.Semaphore(concurrency)

    async def one(subject: Subject) -> ty.RunResult:
        async with gate:
            result = await lab.run_one(subject)
            if result.skipped is not None:
                lab.say(f"skipped {result.run_id or subject.source}: {result.skipped}")
            return result

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(x)) for x in subjects]
    return [t.result() for t in tasks]


def _usage_cells(u: ty.Usage) -> tuple[str, str, str]:
    return str(u.input_tokens), str(u.output_tokens), f"{u.cost_usd:.6f}"


def print_report(r: ty.LabReport) -> None:
    """The report as tables: the rates and usage before and after, the flips, the skipped runs."""
    judged = ", ".join(r.verifiers) if r.verifiers else "every verifier of each run"
    console.print(Text(f"lab {r.name}: {r.edit} at {r.point}; verdict: {judged}", style="bold"))
    console.print(Text(f"{r.runs} runs, {r.counted} forked and judged, {len(r.skipped)} skipped;"
                       f" wall time {r.wall_s:.1f} s"))
    table = Table(title_justify="left")
    for col in ("", "pass rate (95 % interval)", "tokens in", "tokens out", "cost $"):
        table.add_column(col, justify="left" if col in ("", "pass rate (95 % interval)") else "right")
    table.add_row("before", r.before.render(), *_usage_cells(r.before_usage))
    table.add_row("after", r.after.render(), *_usage_cells(r.after_usage))
    console.print(table)
    for title, flips in (("pass → fail", r.pass_to_fail), ("fail → pass", r.fail_to_pass)):
        console.print(Text(f"flipped {title}: {len(flips)}", style="bold"))
        if flips:
            t = Table("run", "branch", "forked at", show_header=True)
            for f in flips:
                t.add_row(Text(f.run_id, no_wrap=True), Text(f.branch_id, no_wrap=True), f.at_step)
            console.print(t)
    if r.skipped:
        console.print(Text(f"skipped: {len(r.skipped)}", style="bold"))
        t = Table("run", "source", "why")
        for sk in r.skipped:
            t.add_row(Text(sk.run_id or "—", no_wrap=True), Text(sk.source), Text(sk.reason))
        console.print(t)


def lab_key(spec: LabSpec, fresh: bool) -> str:
    """The fork's idempotency key prefix: the same SPEC forks a run once (a rerun reads the same branches)."""
    digest = hashlib.sha256(msgspec.json.encode(spec, enc_hook=str)).hexdigest()[:16]
    return f"lab:{digest}" + (f":{time.time_ns()}" if fresh else "")


def lab(
    spec_file: Path = typer.Argument(..., help="the lab SPEC (YAML): runs, at, edit, verifier"),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="runs replayed or forked at once"),
    timeout: float = typer.Option(600.0, min=0.1, help="seconds to wait for each replay and each fork to rest"),
    fresh: bool = typer.Option(False, help="fork again even where this SPEC forked before (new branches)"),
    json_out: bool = typer.Option(False, "--json", help="print the report as one JSON object"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Fork many runs with one edit at one point; print pass rates before and after (95 % intervals), the runs
    whose verdict flipped, the skipped runs, tokens and cost. A line per run forked and finished goes to stderr."""
    async def body() -> int:
        t0 = time.perf_counter()
        spec = load_spec(spec_file)
        subjects = recordings(spec) if spec.runs.recordings is not None else None
        async with session(nats_url, namespace, services=SERVICES) as s:
            chosen = subjects if subjects is not None else await existing(s, spec)
            if not chosen:
                raise CliError("no run has the SPEC's label", kind="lab_spec")
            results = await drive(s, spec, chosen, key=lab_key(spec, fresh), concurrency=concurrency,
                                  timeout_s=timeout)
        report = ty.tally(results, name=spec.name, point=describe_point(spec.at), edit=describe_template(spec.edit),
                          verifiers=spec.verifiers, wall_s=time.perf_counter() - t0)
        if json_out:
            sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
        else:
            print_report(report)
        return 0

    run_async(body(), json_out=json_out)
