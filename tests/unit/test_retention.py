"""The pure part of retention (shared/core/run/retention.py): which runs a policy drops, which blobs are garbage,
how an imported run's LSNs are renumbered; and the retention service's configuration."""

from __future__ import annotations

import pytest

from reel.shared.core.run.events import BlobRef, BranchForked, Commit, RunCompleted, Verdict, VerdictRecorded
from reel.shared.core.run.ids import LSN, BranchId, CommitId, RunId, StepId
from reel.shared.core.run.retention import (
    DAY_MS,
    RetentionPolicy,
    RunSummary,
    StoredBlob,
    blob_refs,
    collectable,
    expired,
    renumber_commit,
)
from reel.shared.core.run.state import RunStatus
from reel.shared.runtime.config import RetentionConfig

NOW = 100 * DAY_MS


def done(rid: str, days_ago: float, status: RunStatus = RunStatus.COMPLETED) -> RunSummary:
    return RunSummary(rid, status, int(NOW - days_ago * DAY_MS))


RUNS = [done("a", 10), done("b", 5), done("c", 1), done("d", 0.5, RunStatus.CANCELLED),
        RunSummary("live", RunStatus.RUNNING, None), RunSummary("asleep", RunStatus.SLEEPING, None)]


def test_keep_days_drops_only_finished_runs_older_than_the_limit() -> None:
    assert expired(RUNS, RetentionPolicy(keep_days=3), NOW) == ["a", "b"]


def test_keep_newest_keeps_the_newest_finished_runs_and_never_a_live_one() -> None:
    assert expired(RUNS, RetentionPolicy(keep_newest=1), NOW) == ["a", "b", "c"]
    assert expired(RUNS, RetentionPolicy(keep_newest=0), NOW) == ["a", "b", "c", "d"]


def test_both_limits_drop_only_what_both_let_go_and_pins_are_kept() -> None:
    assert expired(RUNS, RetentionPolicy(keep_days=3, keep_newest=3), NOW) == ["a"]
    assert expired(RUNS, RetentionPolicy(keep_days=3), NOW, kept=frozenset({"a"})) == ["b"]
    assert expired(RUNS, RetentionPolicy(), NOW) == [], "no limit: nothing is dropped"


def test_blob_refs_finds_stored_refs_anywhere_and_skips_inline_ones() -> None:
    body = (b'{"events": [{"workflow_ref": {"sha256": "aa", "size_bytes": 3, "media_type": "application/json"}},'
            b' {"deep": [{"x": {"sha256": "bb", "size_bytes": 1}}]},'
            b' {"output_ref": {"sha256": "cc", "size_bytes": 2, "inline": "hi"}}]}')
    refs = blob_refs(body)
    assert sorted(refs) == ["aa", "bb"]
    assert refs["aa"] == BlobRef(sha256="aa", size_bytes=3, media_type="application/json")
    assert blob_refs(b"not json") == {}


def test_collectable_spares_referenced_and_young_blobs() -> None:
    blobs = [StoredBlob("old", 1, NOW - 10_000), StoredBlob("young", 2, NOW - 10), StoredBlob("kept", 3, 0)]
    assert [b.sha256 for b in collectable(blobs, {"kept"}, NOW, grace_ms=1000)] == ["old"]


def test_renumber_moves_fork_points_and_judged_snapshots_to_the_new_lsns() -> None:
    lsn_of = {3: 103, 7: 140, 9: 150}
    verdict = Verdict(run_id=RunId("r-x"), branch_id=BranchId("main"), snapshot_lsn=LSN(7), verifier="v",
                      verifier_version="1", step_id=StepId("s"), attempt=1, status="pass", score=1.0, reason="",
                      at_ms=0)
    commit = Commit(commit_id=CommitId("c"), run_id=RunId("r-x"), writer="w", events=(
        VerdictRecorded(verdict=verdict),
        RunCompleted(branch_id=BranchId("main"), outcome="passed", snapshot_lsn=LSN(7), at_ms=0),
        BranchForked(branch_id=BranchId("b2"), parent_branch_id=BranchId("main"), fork_lsn=LSN(8), at_ms=0)))
    moved = renumber_commit(commit, lsn_of)
    v, c, f = moved.events
    assert isinstance(v, VerdictRecorded) and v.verdict.snapshot_lsn == 140
    assert isinstance(c, RunCompleted) and c.snapshot_lsn == 140
    assert isinstance(f, BranchForked) and f.fork_lsn == 140, "a point between commits: the last one at or below"
    with pytest.raises(ValueError, match="below the run's first"):
        renumber_commit(commit, {9: 150})


def test_retention_config_reads_its_variables_and_names_a_bad_one() -> None:
    rc = RetentionConfig.from_env({"REEL_RETENTION_KEEP_DAYS": "30", "REEL_RETENTION_KEEP_NEWEST": "1000",
                                   "REEL_BLOB_GRACE_S": "7200"})
    assert rc.policy == RetentionPolicy(keep_days=30.0, keep_newest=1000)
    assert (rc.sweep_s, rc.blob_grace_s) == (60.0, 7200.0)
    assert not RetentionConfig.from_env({}).policy.on
    with pytest.raises(ValueError, match="REEL_RETENTION_KEEP_NEWEST"):
        RetentionConfig.from_env({"REEL_RETENTION_KEEP_NEWEST": "-1"})
    with pytest.raises(ValueError, match="REEL_RETENTION_KEEP_DAYS must be > 0"):
        RetentionConfig.from_env({"REEL_RETENTION_KEEP_DAYS": "0"})
