"""kill -9 of an executor at each of the four points of an attempt.

A real executor process (``REEL_EXECUTOR_CRASH_AT=s2:1:<point>``) drives three runs of
three command tools at once and dies (``os._exit(137)``, as a kill -9 leaves it) the first
time one of them reaches attempt 1 of step ``s2`` at ``<point>``:

* ``before_intent`` — the commit carrying ``s2#1``'s intent (and ``s1#1``'s outcome) is never sent;
* ``after_intent`` — the intent is acked, the tool never runs;
* ``after_output`` — the tool ran and its output and recovery marker are stored, the outcome never sent;
* ``after_outcome`` — the outcome commit (and ``s3#1``'s chained intent) is acked, nothing after it.

Its runs' start commands come back to a second executor process after the ack wait (3 s);
recovery (a process too) resolves whatever attempt the dead one left dispatched; a
verifier process completes each run. Every invariant of tests/faults/checks.py holds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reel.shared.nats.client import ReelClient
from reel.shared.runtime.config import Config
from tests.faults.checks import check_runs, read_side_effects
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import EXIT_KILLED, ServiceProcs
from tests.faults.scenario import crash_lines, effects_workflow, fault_cfg, record, start_all
from tests.integration.scenarios import attempt_of

pytestmark = pytest.mark.faults

RUNS = 3


@pytest.mark.parametrize("point", ["before_intent", "after_intent", "after_output", "after_outcome"])
async def test_executor_killed_at_a_point_of_an_attempt(
    point: str, cfg: Config, client: ReelClient, tmp_path: Path, faults_ledger: FaultsLedger,
) -> None:
    cfg = fault_cfg(cfg)
    effects = tmp_path / "effects.txt"
    async with ServiceProcs(cfg, tmp_path) as procs:
        await procs.start("verifier")
        await procs.start("recovery")
        crashing = await procs.start("executor", crash_at=f"s2:1:{point}")
        starts = start_all(client, [effects_workflow(effects, f"kill-{point}-{i}") for i in range(RUNS)])
        started = asyncio.ensure_future(starts)
        code = await procs.wait(crashing)
        assert code == EXIT_KILLED, f"exit {code}, not the injected crash: {procs.tail(crashing)}"
        (crash,) = crash_lines(crashing)
        assert crash["point"] == f"s2:1:{point}", crash
        await procs.start("executor")  # takes the runs over when their commands come back
        run_ids = [r.run_id for r in await started if r.run_id]
        counts = await check_runs(client.log, run_ids, side_effects=effects, timeout_s=90)
        record(faults_ledger, f"executor_kill_{point}", counts, procs)

    crashed = crash.get("run_id")
    assert crashed in run_ids, crash
    state = await client.log.load(crashed)
    lines = read_side_effects(effects)
    s2 = attempt_of(state, "s2", 1) if point != "before_intent" else None
    if point == "before_intent":  # the intent was never committed: s1's outcome neither; s1#1 ran, was superseded
        assert [a.attempt for a in state.branches["main"].attempts["s2"]] == [1]
        assert attempt_of(state, "s1", 1).status == "failed" and f"{crashed}:s1:1" in lines
    elif point == "after_intent":  # dispatched, never run: resolved as lost, s2#2 did it
        assert s2 is not None and s2.status == "failed" and f"{crashed}:s2:1" not in lines
        assert attempt_of(state, "s2", 2).status == "succeeded"
    elif point == "after_output":  # ran, output stored: recovery records it from the marker
        assert s2 is not None and s2.status == "succeeded" and s2.recovered and f"{crashed}:s2:1" in lines
    else:  # the outcome is in: nothing of s2 runs again
        assert s2 is not None and s2.status == "succeeded" and not s2.recovered
        assert [ln for ln in lines if ln.startswith(f"{crashed}:s2:")] == [f"{crashed}:s2:1"]
