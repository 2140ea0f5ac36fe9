"""Which ending events the fold accepts in which status: pure checks, no state of their own.

A verdict is recorded once per (branch, snapshot, verifier), by the verification job of a
snapshot the run verified (:func:`reel.shared.core.verify.verification.record`; its retries are fenced,
a rewind verifies a new branch at a new snapshot): a ``verdict_recorded`` for a verifier the
run does not configure, for a branch or snapshot never verified, or a second one for the
same (branch, snapshot, verifier) is refused (:func:`verdict`).

A run ends once: ``run_completed`` is committed only by a verification job, on the run
``verifying`` on the branch (and at the snapshot) it verifies
(:func:`reel.shared.core.verify.verification.completion`); ``run_cancelled`` only on a live run
(:func:`reel.shared.core.mutators.cancel.decide` answers a no-op otherwise). Reel never writes either
elsewhere, so one found elsewhere — a forged ``run_completed`` mid-run above all — is an
illegal transition: the fold refuses it and the run reads corrupt at that LSN
(:mod:`reel.shared.core.run.integrity`). A forged ending that fits these rules cannot be told from
a real one by reading; keeping outsiders off the event subjects is the permissions' job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from reel.shared.core.errors import InvalidTransition
from reel.shared.core.run.events import RunCompleted, Verdict, VerdictRecorded
from reel.shared.core.run.ids import LSN, BranchId
from reel.shared.core.run.state import CANCELLED, COMPLETED, LIVE, VERIFYING, BranchState, RunState, RunStatus


class FoldingBranch(Protocol):
    """A branch as the fold holds it."""

    @property
    def base(self) -> BranchState: ...


class Folding(Protocol):
    """What the checks read of the run being folded (the fold's accumulator)."""

    @property
    def verdicts(self) -> Sequence[Verdict]: ...  # recorded since ``base`` (the rest are in ``base.verdicts``)

    @property
    def active_branch(self) -> BranchId: ...

    def branch(self, branch_id: BranchId) -> FoldingBranch | None: ...

    @property
    def base(self) -> RunState: ...

    @property
    def status(self) -> RunStatus: ...

    @property
    def verifying_branch(self) -> BranchId | None: ...

    @property
    def verifying_lsn(self) -> LSN | None: ...


def completed(run: Folding, event: RunCompleted) -> RunStatus:
    """The status after ``event``: ``completed``, if a verification job could have committed it.

    ``snapshot_lsn`` 0 (logs written before it existed) is not compared.

    Raises:
        InvalidTransition: the run is not ``verifying`` on ``event.branch_id`` (at ``event.snapshot_lsn``).
    """
    status, branch, at = run.status, run.verifying_branch, run.verifying_lsn
    if status != VERIFYING or event.branch_id != branch or event.snapshot_lsn not in (0, at):
        raise InvalidTransition(
            f"run_completed of branch {event.branch_id!r} at snapshot {event.snapshot_lsn} on a run {status}"
            + (f" on {branch!r} at {at}" if status == VERIFYING else ""), run_id=run.base.run_id)
    return COMPLETED


def cancelled(run: Folding) -> RunStatus:
    """The status after a ``run_cancelled``: ``cancelled``, if the run has not ended.

    Raises:
        InvalidTransition: the run is ``completed`` or ``cancelled``.
    """
    if run.status not in LIVE:
        raise InvalidTransition(f"run_cancelled on a {run.status} run", run_id=run.base.run_id)
    return CANCELLED


def verdict(run: Folding, lsn: LSN, event: VerdictRecorded) -> Verdict:
    """The verdict ``event`` records at ``lsn``, if the run's verification job could have recorded it.

    Its verifier must be one the run configures, its branch one that verified at its snapshot (an
    earlier commit of that branch; the run's verifying snapshot when that branch is the one verifying,
    or verified last; never the active branch before it verifies), and no verdict of that verifier
    may be recorded for that branch and snapshot already.

    Raises:
        InvalidTransition: it could not (a forged or duplicate verdict).
    """
    v = event.verdict
    where = f"verdict_recorded of {v.verifier[:80]!r} for branch {v.branch_id[:80]!r} at snapshot {v.snapshot_lsn}"
    branch = run.branch(v.branch_id)
    if v.verifier not in run.base.verifiers:
        why = "the run configures no such verifier"
    elif branch is None:
        why = "no such branch"
    elif not branch.base.created_lsn <= v.snapshot_lsn < lsn:
        why = f"the snapshot is not an earlier commit of that branch (created at {branch.base.created_lsn})"
    elif v.branch_id == run.verifying_branch and v.snapshot_lsn != run.verifying_lsn:
        why = f"that branch verifies at {run.verifying_lsn}"
    elif v.branch_id == run.active_branch and v.branch_id != run.verifying_branch:
        why = "that branch has not verified"
    elif any(r.verifier == v.verifier and r.branch_id == v.branch_id and r.snapshot_lsn == v.snapshot_lsn
             for r in (*run.base.verdicts, *run.verdicts)):
        why = "a verdict of that verifier for that snapshot is recorded already"
    else:
        return v
    raise InvalidTransition(f"{where}: {why}", run_id=run.base.run_id)
