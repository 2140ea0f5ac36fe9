"""The verifier's pure decisions: record a verdict once, complete a run only at its snapshot.

A verification job judges one run at one snapshot LSN P on one branch. The
service (services/verifier) runs the verifiers and commits through
:func:`reel.shared.application.fenced.commit_decided`; what it commits is decided here, on the run's
state at the head, with no clock (the time comes in as an argument), no I/O and
no logging:

* :func:`record` — a verdict is recorded unless one for its (branch, P, verifier)
  already is (a restarted job, or a racing instance, got there first);
* :func:`completion` — ``run_completed`` only if the run still rests in
  ``verifying`` at P on that branch with every configured verdict recorded; its
  outcome by :func:`derive_outcome`;
* :func:`corrupt_verdicts` — a run found corrupt (:mod:`reel.shared.core.run.integrity`) gets an
  ``error`` verdict from each verifier not yet recorded, naming the bad LSN and why:
  published, never recorded (no writer commits on top of a corrupt run).
"""

from __future__ import annotations

from collections.abc import Sequence

from reel.shared.core.decision import Decision, Skip
from reel.shared.core.run.events import RunCompleted, RunOutcome, Verdict, VerdictRecorded, VerdictStatus
from reel.shared.core.run.ids import LSN, BranchId, RunId
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.state import RunState


def recorded(state: RunState, branch_id: BranchId, snapshot_lsn: LSN) -> dict[str, Verdict]:
    """The verdicts in ``state`` for (``branch_id``, ``snapshot_lsn``), by verifier name."""
    return {v.verifier: v for v in state.verdicts if v.snapshot_lsn == snapshot_lsn and v.branch_id == branch_id}


VERDICT_RECORDED = Skip("verdict recorded")
"""The decision when a verdict for the (branch, snapshot, verifier) is recorded already."""
MOVED = Skip("moved")
"""No completion: the run no longer rests in ``verifying`` at the job's snapshot and branch (cancelled,
rewound, completed)."""
VERDICTS_MISSING = Skip("verdicts_missing")
"""No completion yet: a configured verifier has no verdict (not after a finished job)."""


def record(state: RunState, verdict: Verdict) -> Decision:
    """``(verdict_recorded,)``, or :data:`VERDICT_RECORDED` if one for its (branch, snapshot, verifier) is in."""
    if verdict.verifier in recorded(state, verdict.branch_id, verdict.snapshot_lsn):
        return VERDICT_RECORDED
    return (VerdictRecorded(verdict=verdict),)


def completion(state: RunState, *, branch_id: BranchId, snapshot_lsn: LSN, step_failed: bool,
               at_ms: int) -> Decision:
    """``(run_completed,)`` if the job at (``branch_id``, ``snapshot_lsn``) completes ``state`` (with which
    outcome), else :data:`MOVED` or :data:`VERDICTS_MISSING`.

    Args:
        step_failed: a step of the branch failed for good, as of the snapshot
            (:func:`reel.shared.core.run.state.branch_failed` on the pinned state).
        at_ms: the completion time (epoch ms).
    """
    if (state.status, state.verifying_lsn, state.verifying_branch) != ("verifying", snapshot_lsn, branch_id):
        return MOVED
    verdicts = recorded(state, branch_id, snapshot_lsn)
    if any(name not in verdicts for name in state.verifiers):
        return VERDICTS_MISSING
    outcome = derive_outcome(step_failed=step_failed, statuses=[verdicts[n].status for n in state.verifiers])
    return (RunCompleted(branch_id=branch_id, outcome=outcome, snapshot_lsn=snapshot_lsn, at_ms=at_ms),)


def derive_outcome(*, step_failed: bool, statuses: Sequence[VerdictStatus]) -> RunOutcome:
    """The run's outcome from its branch and the verdicts for one snapshot (pure).

    A step failed after its last attempt → ``failed``; else no verifier →
    ``succeeded``; all pass → ``passed``; any fail → ``failed``; else (some
    error, no fail) → ``error``.
    """
    if step_failed:
        return "failed"
    if not statuses:
        return "succeeded"
    if all(s == "pass" for s in statuses):
        return "passed"
    if any(s == "fail" for s in statuses):
        return "failed"
    return "error"


def corrupt_verdicts(run_id: RunId, branch_id: BranchId, snapshot_lsn: LSN, corrupt: RunCorrupt, *,
                     at_ms: int) -> list[Verdict]:
    """The ``error`` verdicts of the job at (``branch_id``, ``snapshot_lsn``) on a run found corrupt.

    One per configured verifier (as of the run's last good commit) without a recorded verdict for
    that point; none when not even the run's first commit is good (its verifiers are unknown).
    """
    state = corrupt.state
    if state is None:
        return []
    done = recorded(state, branch_id, snapshot_lsn)
    return [Verdict(run_id=run_id, branch_id=branch_id, snapshot_lsn=snapshot_lsn, verifier=name, status="error",
                    reason=corrupt.message, at_ms=at_ms) for name in state.verifiers if name not in done]
