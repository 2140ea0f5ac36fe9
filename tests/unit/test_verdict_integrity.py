"""A forged or duplicate ``verdict_recorded`` is poison (shared/core/run/lifecycle.py ``verdict``).

The verification job records one verdict per (branch, snapshot, verifier) of a snapshot the
run verified (its retries are fenced: :func:`reel.shared.core.verify.verification.record`); anything else
marks the run corrupt at that LSN, its state the one before, and a late verdict of an earlier
branch (after a rewind) or of a cancelled run is still accepted.
"""

from __future__ import annotations

import pytest

from reel.shared.core.run.events import BranchForked, Commit, RunCancelled, RunCompleted, Verdict, VerdictRecorded
from reel.shared.core.run.fold import fold
from reel.shared.core.run.ids import LSN
from reel.shared.core.run.integrity import CorruptionKind, fold_checked
from reel.shared.core.run.statecodec import encode_state
from tests.unit.test_integrity import RUN, commit, history


def verdict(verifier: str = "v1", *, branch: str = "main", snapshot: int = 14, status: str = "pass") -> VerdictRecorded:
    return VerdictRecorded(verdict=Verdict(run_id=RUN, branch_id=branch, snapshot_lsn=snapshot, verifier=verifier,
                                           status=status, score=1.0))  # type: ignore[arg-type]


def after(*commits: Commit) -> list[tuple[int, Commit]]:
    """history() (14: verifying on main) then ``commits`` at 15, 16, …"""
    return [*history(), *((15 + i, c) for i, c in enumerate(commits))]


def test_the_real_verdicts_of_a_job_fold() -> None:
    state, bad = fold_checked(after(commit(verdict("v1")), commit(verdict("v2", status="fail")),
                                    commit(RunCompleted(branch_id="main", outcome="failed", snapshot_lsn=LSN(14),
                                                        at_ms=9))))
    assert bad is None and state is not None and [v.verifier for v in state.verdicts] == ["v1", "v2"]


@pytest.mark.parametrize(("forged", "words"), [
    (verdict("v1"), "recorded already"),  # a second verdict for the same verifier and snapshot
    (verdict("v1", status="fail"), "recorded already"),  # ... whatever it says
    (verdict("v9"), "configures no such verifier"),  # a verifier never asked
    (verdict("v2", snapshot=13), "verifies at 14"),  # a snapshot the branch did not verify at
    (verdict("v2", snapshot=99), "not an earlier commit"),  # a snapshot above the commit itself
    (verdict("v2", branch="b-nope"), "no such branch"),
])
def test_a_forged_verdict_marks_the_run_corrupt_at_its_lsn(forged: VerdictRecorded, words: str) -> None:
    commits = after(commit(verdict("v1")), commit(forged))
    state, bad = fold_checked(commits)
    assert bad is not None and (bad.lsn, bad.kind) == (16, CorruptionKind.INVALID_TRANSITION), bad
    assert words in bad.reason and "verdict_recorded of" in bad.reason
    assert state is not None and encode_state(state) == encode_state(fold(commits[:-1]))


def test_a_verdict_in_the_commit_of_its_own_snapshot_or_before_verifying_is_forged() -> None:
    running = history()[:4]  # 13: a succeeded, the run not verifying yet
    _, bad = fold_checked([*running, (14, commit(verdict("v1", snapshot=13)))])
    assert bad is not None and "has not verified" in bad.reason
    _, bad = fold_checked([*history()[:4], (14, commit(*history()[4][1].events, verdict("v1", snapshot=14)))])
    assert bad is not None and "not an earlier commit" in bad.reason


def test_late_verdicts_after_a_cancel_or_a_rewind_still_fold() -> None:
    cancelled = after(commit(RunCancelled(reason="stop", at_ms=8)), commit(verdict("v1")))
    assert fold_checked(cancelled)[1] is None
    fork = BranchForked(branch_id="b-2", parent_branch_id="main", fork_lsn=LSN(12), from_step=None, at_ms=8)
    rewound = after(commit(verdict("v1")), commit(fork), commit(verdict("v2")))  # v2 of main's snapshot, late
    state, bad = fold_checked(rewound)
    assert bad is None and state is not None and state.active_branch == "b-2" and len(state.verdicts) == 2
    _, bad = fold_checked(after(commit(fork), commit(verdict("v1", branch="b-2", snapshot=15))))
    assert bad is not None and "has not verified" in bad.reason  # the new branch has not verified yet
    _, bad = fold_checked(after(commit(verdict("v1")), commit(fork), commit(verdict("v1"))))
    assert bad is not None and "recorded already" in bad.reason  # nor is main's v1 recorded twice after it
