"""Which ending events the fold accepts in which status (brief §2): pure checks, no state of their own.

A run ends once: ``run_completed`` is committed only by a verification job, on the run
``verifying`` on the branch (and at the snapshot) it verifies
(:func:`shared.core.verification.completion`); ``run_cancelled`` only on a live run
(:func:`shared.core.cancel.decide` answers a no-op otherwise). Reel never writes either
elsewhere, so one found elsewhere — a forged ``run_completed`` mid-run above all — is an
illegal transition: the fold refuses it and the run reads corrupt at that LSN
(:mod:`shared.core.integrity`). A forged ending that fits these rules cannot be told from
a real one by reading; keeping outsiders off the event subjects is the permissions' job (§12).
"""

from __future__ import annotations

from typing import Protocol

from shared.core.errors import InvalidTransition
from shared.core.events import RunCompleted
from shared.core.ids import LSN, BranchId
from shared.core.state import CANCELLED, COMPLETED, LIVE, VERIFYING, RunState, RunStatus


class Folding(Protocol):
    """What the checks read of the run being folded (the fold's accumulator)."""

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
