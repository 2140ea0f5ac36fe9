"""The checkers themselves catch what they count (hand-made runs on a real server, no services)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    RunCompleted,
    RunStarted,
    RunVerifying,
)
from reel.shared.core.run.ids import run_id_for_key
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.faults.checks import check_runs
from tests.integration.scenarios import commit_events, create_manual_run

pytestmark = pytest.mark.faults

OUT = BlobRef(sha256="1" * 64, size_bytes=0, media_type="text/plain")


async def _completed_run(log: JetStreamEventLog, run_id: str) -> None:
    await create_manual_run(log, run_id, [("a", 1)])
    await commit_events(log, run_id, RunStarted(executor_id="e-1", at_ms=1),
                        AttemptDispatched(branch_id="main", step_id="a", attempt=1, executor_id="e-1", at_ms=1))
    await commit_events(log, run_id, AttemptSucceeded(branch_id="main", step_id="a", attempt=1, output_ref=OUT,
                                                      at_ms=2), RunVerifying(branch_id="main", at_ms=2))
    await commit_events(log, run_id, RunCompleted(branch_id="main", outcome="passed", snapshot_lsn=0, at_ms=3))


async def test_a_clean_run_counts_nothing_and_its_side_effect_matches(event_log: JetStreamEventLog,
                                                                      tmp_path: Path) -> None:
    await _completed_run(event_log, "r-clean")
    effects = tmp_path / "fx"
    effects.write_text("r-clean:a:1\n")
    counts = await check_runs(event_log, ["r-clean", "r-clean"], side_effects=effects, timeout_s=5)
    assert (counts.runs, counts.lost, counts.stuck, counts.unrecorded, counts.side_effects) == (1, 0, 0, 0, 1)
    counts.assert_clean()


async def test_lost_stuck_and_unrecorded_are_counted(event_log: JetStreamEventLog, tmp_path: Path) -> None:
    await _completed_run(event_log, "r-done")
    await create_manual_run(event_log, "r-stuck", [("a", 1)])
    await commit_events(event_log, "r-stuck", RunStarted(executor_id="e-1", at_ms=1),
                        AttemptDispatched(branch_id="main", step_id="a", attempt=1, executor_id="e-1", at_ms=1))
    effects = tmp_path / "fx"
    effects.write_text("r-done:a:1\nr-done:a:2\nr-done:zz:1\nr-nobody:a:1\ngarbage\n")
    counts = await check_runs(event_log, ["r-done", "r-stuck", "r-never"], side_effects=effects, timeout_s=1)
    assert (counts.runs, counts.lost, counts.stuck, counts.unrecorded) == (3, 1, 1, 4), counts.problems
    with pytest.raises(AssertionError, match="1 lost, 1 stuck, 4 unrecorded"):
        counts.assert_clean()


async def test_two_run_completed_on_one_branch_is_lost(event_log: JetStreamEventLog) -> None:
    run_id = run_id_for_key("k")  # the run an idempotency key names
    await _completed_run(event_log, run_id)
    extra = RunCompleted(branch_id="main", outcome="passed", snapshot_lsn=0, at_ms=4)
    await commit_events(event_log, run_id, extra)  # stored (a raw append); the fold refuses it: corrupt at that LSN
    counts = await check_runs(event_log, [run_id], timeout_s=1)
    assert counts.lost == 1 and "corrupt" in counts.problems[0], counts.problems
