"""A run's verdicts, pure: the verifier's decisions (record a verdict once, complete a run only at its snapshot)
and what every reader reports as the run's outcome.

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

The reported outcome keeps outcome verifiers apart from context checks. A replayed recording gets a *context
check*, ``task-in-final-context`` (a ``context_requires`` verifier: was the task item still packed into the
last recorded turn's context?). That checks Reel's packing, not whether the recorded agent succeeded; so it
must not make a recording without an outcome label read ``passed``. The log keeps what the verifier service
committed (``run_completed`` with its outcome over every verifier: golden logs and old stores fold unchanged);
these functions are how every reader *reports* it:

* :func:`context_checks` — the run's verifiers that are context checks: the names
  in the run's ``context_checks`` label (comma-separated; the trajectory loader
  sets it on every replayed workflow, empty when there is none), or, for a run
  replayed before that label existed (label ``replayed_from`` but no
  ``context_checks``), ``task-in-final-context`` if the run has it;
* :func:`reported_outcome` — the outcome over the *other* verifiers (the outcome
  verifiers, e.g. ``recorded_outcome``) by the same rule
  (:func:`derive_outcome`), and :data:`UNLABELLED` when a
  run whose verifiers are declared this way (the label is present) has no outcome
  verifier and no step failed. A run without the label reports its logged outcome.
"""

from __future__ import annotations

from collections.abc import Sequence

from reel.shared.core.decision import Decision, Skip
from reel.shared.core.run.events import RunCompleted, RunOutcome, Verdict, VerdictRecorded, VerdictStatus
from reel.shared.core.run.ids import LSN, BranchId, RunId
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.state import RunState, branch_failed


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

CONTEXT_CHECKS_LABEL = "context_checks"
"""Run label naming the verifiers that are context checks, comma-separated (``""``: none)."""
LEGACY_CHECKS = ("task-in-final-context",)
"""Context checks of runs replayed before :data:`CONTEXT_CHECKS_LABEL` existed."""
UNLABELLED = "unlabelled"
"""The reported outcome of a completed run that had no outcome verifier (a recording without a label)."""


def declares_checks(state: RunState) -> bool:
    """Whether the run says which of its verifiers are context checks (a replayed run: yes)."""
    return CONTEXT_CHECKS_LABEL in state.labels or "replayed_from" in state.labels


def context_checks(state: RunState) -> tuple[str, ...]:
    """The run's context-check verifiers, in the run's verifier order (``()`` for most live runs)."""
    raw = state.labels.get(CONTEXT_CHECKS_LABEL)
    names = {n.strip() for n in raw.split(",") if n.strip()} if raw is not None else (
        set(LEGACY_CHECKS) if "replayed_from" in state.labels else set())
    return tuple(v for v in state.verifiers if v in names)


def final_verdicts(state: RunState) -> dict[str, Verdict]:
    """The verdict per verifier the run was (or is being) judged by: those of its verification
    snapshot (branch and LSN) when it has one, else the latest of each on the active branch."""
    out: dict[str, Verdict] = {}
    for v in state.verdicts:
        if state.verifying_lsn is not None:
            if v.snapshot_lsn == state.verifying_lsn and v.branch_id == state.verifying_branch:
                out[v.verifier] = v
        elif v.branch_id == state.active_branch:
            out[v.verifier] = v
    return out


def check_verdicts(state: RunState) -> list[Verdict]:
    """The context checks' verdicts (see :func:`final_verdicts`), in the run's verifier order."""
    got = final_verdicts(state)
    return [got[n] for n in context_checks(state) if n in got]


def reported_outcome(state: RunState) -> str | None:
    """The run's outcome as Reel reports it: ``None`` until it completes, else ``passed`` / ``failed`` /
    ``error`` / ``succeeded`` over its outcome verifiers, or :data:`UNLABELLED` (see the module doc)."""
    if state.outcome is None or not declares_checks(state):
        return state.outcome
    checks = set(context_checks(state))
    judges = [n for n in state.verifiers if n not in checks]
    branch = state.verifying_branch or state.active_branch
    failed = branch in state.branches and branch_failed(state, branch)
    if not judges:
        return "failed" if failed else UNLABELLED
    got = final_verdicts(state)
    if any(n not in got for n in judges):  # not judged as expected: what the log says
        return state.outcome
    return derive_outcome(step_failed=failed, statuses=[got[n].status for n in judges])


def checks_summary(state: RunState) -> str:
    """``task-in-final-context=pass`` (one per context check, comma-separated), ``""`` when none."""
    return ", ".join(f"{v.verifier}={v.status}" for v in check_verdicts(state))
