"""The folded state of one run and its statuses (brief §2, §4): what :mod:`shared.core.fold` produces.

Statuses are :class:`enum.StrEnum`s: a member *is* its string (``RunStatus.RUNNING ==
"running"``, same hash, ``str()``/``format()`` give the value), and msgspec encodes it
as that string, so the JSON of a state and every comparison with a plain string are
unchanged. Ids and LSNs are the ``NewType``s of :mod:`shared.core.ids` (plain ``str`` /
``int`` on the wire).
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from shared.core.agentstate import AgentRecord
from shared.core.events import BlobRef, ContextPartition, RunOutcome, StepDecl, Usage, Verdict
from shared.core.ids import LSN, AttemptNo, BranchId, ExecutorId, RunId, StepId


class RunStatus(StrEnum):
    """Where a run is in its lifecycle: ``pending → running → verifying → completed``, or ``cancelled``."""

    PENDING = "pending"
    RUNNING = "running"
    VERIFYING = "verifying"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class AttemptStatus(StrEnum):
    """An attempt's record: its intent is committed (``dispatched``), then exactly one outcome."""

    DISPATCHED = "dispatched"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class StepStatus(StrEnum):
    """A step's status on one branch, derived from its attempts (:func:`shared.core.fold.step_statuses`)."""

    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"


LIVE: frozenset[RunStatus] = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.VERIFYING})
"""Statuses a run can leave: cancel is legal in each (brief §2)."""
DRIVABLE: frozenset[RunStatus] = frozenset({RunStatus.PENDING, RunStatus.RUNNING})
"""Statuses in which an executor drives the run."""
RESTING: frozenset[RunStatus] = frozenset({RunStatus.VERIFYING, RunStatus.COMPLETED, RunStatus.CANCELLED})
"""Statuses in which no executor drives the run."""
STEP_TERMINAL: frozenset[StepStatus] = frozenset({StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED})
"""Step statuses that no further attempt changes (a branch whose steps are all terminal is done)."""


class AttemptState(msgspec.Struct, kw_only=True):
    """One attempt of one step on one branch, as of the folded LSN."""

    step_id: StepId
    attempt: AttemptNo
    status: AttemptStatus
    executor_id: ExecutorId
    dispatched_lsn: LSN
    dispatched_ms: int
    prompt_ref: BlobRef | None = None
    context: ContextPartition | None = None
    outcome_lsn: LSN | None = None
    finished_ms: int | None = None
    output_ref: BlobRef | None = None
    usage: Usage = Usage()
    error_kind: str | None = None
    error_message: str | None = None
    retryable: bool = True
    recovered: bool = False


class BranchState(msgspec.Struct, kw_only=True):
    """One line of history of a run; ``attempts`` maps step id → attempts in order (an agent's turns and
    calls too); ``agents`` holds the agent steps' declarations and outcomes (:mod:`shared.core.agentfold`;
    unset, and not encoded, on a branch without agents)."""

    branch_id: BranchId
    parent_branch_id: BranchId | None = None
    fork_lsn: LSN | None = None
    from_step: StepId | None = None
    created_lsn: LSN
    attempts: dict[StepId, list[AttemptState]] = {}
    agents: dict[StepId, AgentRecord] | msgspec.UnsetType = msgspec.UNSET


class RunState(msgspec.Struct, kw_only=True):
    """Everything known about one run at ``head_lsn``."""

    run_id: RunId
    status: RunStatus
    workflow_name: str
    workflow_ref: BlobRef
    steps: tuple[StepDecl, ...]
    verifiers: tuple[str, ...] = ()
    idempotency_key: str | None = None
    labels: dict[str, str] = {}
    created_ms: int
    created_lsn: LSN
    head_lsn: LSN
    commits: int = 0
    executor_id: ExecutorId | None = None
    active_branch: BranchId
    branches: dict[BranchId, BranchState] = {}
    verifying_lsn: LSN | None = None
    verifying_branch: BranchId | None = None
    verdicts: list[Verdict] = []
    outcome: RunOutcome | None = None
    cancel_reason: str | None = None
    finished_ms: int | None = None

    def step_decl(self, step_id: StepId) -> StepDecl:
        """The declaration of ``step_id`` (O(1)).

        Raises:
            KeyError: unknown step.
        """
        return self.steps[_positions(self.steps)[step_id]]

    def step_index(self, step_id: StepId) -> int:
        """Position of ``step_id`` in the workflow (0-based, O(1)). Raises KeyError."""
        return _positions(self.steps)[step_id]


_POSITIONS: dict[int, tuple[tuple[StepDecl, ...], dict[StepId, int]]] = {}
_POSITIONS_MAX = 4096


def _positions(steps: tuple[StepDecl, ...]) -> dict[StepId, int]:
    """Step id → index for one ``steps`` tuple, built once per tuple (keyed by identity; the
    entry holds the tuple, so its id cannot be reused while cached)."""
    hit = _POSITIONS.get(id(steps))
    if hit is not None and hit[0] is steps:
        return hit[1]
    if len(_POSITIONS) >= _POSITIONS_MAX:
        _POSITIONS.clear()
    index = {d.step_id: i for i, d in enumerate(steps)}
    _POSITIONS[id(steps)] = (steps, index)
    return index
