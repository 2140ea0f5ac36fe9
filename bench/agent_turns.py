"""Executor CPU per agent turn along one long agent run, incremental contexts vs the old full rebuild.

The workload is bench/w_kr.py's agent variant (bench/_wkr_reel.py ``agent_workflow``): one agent step
of K scripted turns, each calling the no-op async Python tool once, then a final answer; the default
context budget (8,000 tokens), so from about turn 90 the oldest turns are left out (``available``).
Two stacks run side by side, each an embedded nats-server with its own executor and verifier
processes: this tree, and ``--baseline`` (a git revision, default the last one before incremental
packing, extracted with ``git archive``), the runs interleaved round by round. Per turn, the
executor's CPU (``/proc/<pid>/task/*/schedstat``) is read when the commit carrying the turn's intent
arrives on a core subscription; a turn's cost is the difference to the next one's.

It also replays this tree's last run in process and times one turn's context build in full
(:func:`reel.shared.core.agent.turncontext.build_turn`) vs from a warm :class:`reel.shared.core.agent.memo.ContextMemo`
(medians of 30), at turn 20 and at the last turn — the packing cost alone.

Usage: ``python bench/agent_turns.py [--turns 200] [--rounds 3] [--baseline 9490710]``; last line:
``ratio last_vs_first=<new> baseline_last_vs_first=<old> last_window_new_vs_old=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _bench_common import machine_note
from _wkr_reel import REPO, TURN, WORKFLOWS, Stack, proc_cpu_s, reel_stack
from nats.aio.msg import Msg

from reel.shared.core.agent.actions import DispatchTurn
from reel.shared.core.agent.memo import ContextMemo
from reel.shared.core.agent.turncontext import build_turn, needed_blobs
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.events import AttemptDispatched, AttemptEnd, AttemptFailed, AttemptSucceeded, decode_commit
from reel.shared.core.run.fold import apply_commit
from reel.shared.core.run.ids import AttemptNo, StepId
from reel.shared.core.run.planning import TextFacts
from reel.shared.core.run.state import RunState
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.workflow.spec import WorkflowSpec

BASELINE = "9490710"  # main before incremental packing (shared/core/agent/memo.py)


class TurnMeter:
    """Executor CPU (s) at each turn intent commit of the runs on one stack, by run id."""

    def __init__(self, stack: Stack) -> None:
        self.pid = stack.procs["executor"].pid
        self.at: dict[str, list[float]] = {}

    async def on_commit(self, msg: Msg) -> None:
        if b"attempt_dispatched" not in msg.data:
            return
        for e in decode_commit(msg.data).events:
            if isinstance(e, AttemptDispatched) and TURN.search(e.step_id):
                self.at.setdefault(msg.subject.rsplit(".", 1)[-1], []).append(proc_cpu_s(self.pid))
                return

    def per_turn_us(self, run_id: str) -> list[float]:
        """CPU µs of each turn (intent to next intent), in turn order."""
        xs = self.at.get(run_id, [])
        return [(b - a) * 1e6 for a, b in itertools.pairwise(xs)]


def windows(k: int) -> list[tuple[int, int]]:
    """The turn windows reported (1-based, inclusive): the first 20, 20 in the middle, the last 20."""
    mid = k // 2
    return [(1, 20), (mid - 9, mid + 10), (k - 19, k)]


def window_mean(per_turn: list[float], lo: int, hi: int) -> float:
    part = per_turn[lo - 1:hi]
    return statistics.fmean(part) if part else float("nan")


async def one_round(stacks: dict[str, Stack], meters: dict[str, TurnMeter], order: list[str], k: int, tag: str,
                    n: int) -> dict[str, tuple[str, list[float]]]:
    out = {}
    for name in order:
        spec = WORKFLOWS["agent"](n, k)
        run_id, _, _ = await stacks[name].run(spec, f"{tag}-{name}-{n}", timeout_s=600)
        await asyncio.sleep(0.2)  # the core subscription's last deliveries
        out[name] = (run_id, meters[name].per_turn_us(run_id))
    return out


async def log_of(stack: Stack, run_id: str) -> tuple[list[tuple[int, Any]], dict[str, bytes]]:
    log = [(int(lsn), c) for lsn, c in await stack.client.log.read(run_id)]
    refs = {}
    for _, c in log:
        for e in c.events:
            for r in (getattr(e, "output_ref", None), getattr(e, "prompt_ref", None)):
                if r is not None:
                    refs[r.sha256] = r
    store = stack.client.blobs
    assert store is not None
    bodies = await asyncio.gather(*(store.get(r) for r in refs.values()))
    return log, dict(zip(refs, bodies, strict=True))


def packing_costs(log: list[tuple[int, Any]], blobs: dict[str, bytes], spec: WorkflowSpec, turns: list[int]
                  ) -> dict[int, tuple[float, float]]:
    """Median µs of one turn's context build, full vs warm memo, at each of ``turns`` (replayed from ``log``)."""
    at: dict[int, tuple[RunState, AttemptDispatched, list[AttemptEnd]]] = {}
    state: RunState | None = None
    for lsn, commit in log:
        before, state = state, apply_commit(state, lsn, commit)
        pending: list[AttemptEnd] = []
        for e in commit.events:
            if isinstance(e, AttemptSucceeded | AttemptFailed):
                pending.append(e)
            parsed = parse_step_id(e.step_id) if isinstance(e, AttemptDispatched) else None
            if isinstance(e, AttemptDispatched) and parsed is not None and parsed[2] < 0 and before is not None:
                at[parsed[1]] = (before, e, list(pending))
    return {t: _time_turn(*at[t], t, spec, blobs) for t in turns}


def _time_turn(before: RunState, e: AttemptDispatched, pending: list[AttemptEnd], t: int, spec: WorkflowSpec,
               blobs: dict[str, bytes]) -> tuple[float, float]:
    agent = spec.agent(StepId("a"))
    action = DispatchTurn(branch_id=e.branch_id, agent=StepId("a"), step_id=e.step_id, turn=t,
                          attempt=AttemptNo(e.attempt), declare=False)
    facts, memo = TextFacts(DEFAULT_COUNTER), ContextMemo(TextFacts(DEFAULT_COUNTER))

    def full() -> Any:
        need = {r.sha256: blobs[r.sha256] for r in needed_blobs(before, e.branch_id, action.agent, t, pending)}
        return build_turn(before, action, agent, spec, run_outputs={}, blobs=need, facts=facts, outcomes=pending)

    def incremental() -> Any:
        todo = memo.plan(before, e.branch_id, action.agent, t, pending)
        return memo.build(todo, before, action, agent, spec, run_outputs={},
                          blobs={r.sha256: blobs[r.sha256] for r in todo.refs}, outcomes=pending)

    assert full().packed == incremental().packed  # warms both memos, and checks
    return _median_us(full), _median_us(incremental)


def _median_us(fn: Callable[[], Any], n: int = 30) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(xs)


def baseline_tree(rev: str, into: Path) -> Path:
    """The source tree of ``rev`` (``git archive``), extracted under ``into``."""
    tree = into / f"reel-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


async def main(args: argparse.Namespace) -> None:
    load0 = machine_note()
    k = args.turns
    with tempfile.TemporaryDirectory(prefix="agent-turns-") as tmp:
        base = baseline_tree(args.baseline, Path(tmp))
        dirs = {n: Path(tmp, n) for n in ("new", "old")}
        for d in dirs.values():
            d.mkdir()
        async with contextlib.AsyncExitStack() as es:
            stacks = {"new": await es.enter_async_context(reel_stack("default", str(dirs["new"]), 4)),
                      "old": await es.enter_async_context(reel_stack("default", str(dirs["old"]), 4, repo=base))}
            meters = {n: TurnMeter(s) for n, s in stacks.items()}
            for n, s in stacks.items():
                await s.client.nc.subscribe(s.cfg.names.events("*"), cb=meters[n].on_commit)
            tag = uuid.uuid4().hex[:6]
            await one_round(stacks, meters, ["new", "old"], 20, tag + "-warm", 0)
            per: dict[str, list[list[float]]] = {"new": [], "old": []}
            last_run = ""
            for r in range(args.rounds):
                order = ["new", "old"] if r % 2 == 0 else ["old", "new"]
                got = await one_round(stacks, meters, order, k, tag, r + 1)
                for name, (_, xs) in got.items():
                    assert len(xs) == k, (name, len(xs))
                    per[name].append(xs)
                last_run = got["new"][0]
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
            log, blobs = await log_of(stacks["new"], last_run)
        packing = packing_costs(log, blobs, WORKFLOWS["agent"](args.rounds, k), [20, k + 1])
    report(per, packing, k, load0, machine_note())


def report(per: dict[str, list[list[float]]], packing: dict[int, tuple[float, float]], k: int, load0: str,
           load1: str) -> None:
    ws = windows(k)
    print(f"agent turns: {k} turns per run, {len(per['new'])} rounds, medians over rounds; load {load0} → {load1}")
    print(f"{'executor CPU µs/turn':<24}" + "".join(f"{f'turns {a}-{b}':>16}" for a, b in ws)
          + f"{'whole run':>12}{'last/first':>12}")
    med: dict[str, list[float]] = {}
    for name, label in (("old", "full rebuild (baseline)"), ("new", "incremental")):
        med[name] = [statistics.median(window_mean(xs, a, b) for xs in per[name]) for a, b in ws]
        whole = statistics.median(statistics.fmean(xs) for xs in per[name])
        print(f"{label:<24}" + "".join(f"{v:>16,.0f}" for v in med[name]) + f"{whole:>12,.0f}"
              + f"{med[name][-1] / med[name][0]:>12.2f}")
    print(f"{'new / old':<24}" + "".join(f"{n / o:>16.2f}" for n, o in zip(med["new"], med["old"], strict=True)))
    for t, (full, inc) in packing.items():
        print(f"context build at turn {t}: full {full:,.0f} µs, incremental {inc:,.0f} µs ({full / inc:.1f}×)")
    print(f"ratio last_vs_first={med['new'][-1] / med['new'][0]:.2f} "
          f"baseline_last_vs_first={med['old'][-1] / med['old'][0]:.2f} "
          f"last_window_new_vs_old={med['new'][-1] / med['old'][-1]:.2f}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the old path (default: %(default)s)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
