"""The folded state of one run and its statuses: what :mod:`reel.shared.core.run.fold` produces.

Statuses are :class:`enum.StrEnum`s: a member *is* its string (``RunStatus.RUNNING == "running"``,
same hash, ``str()``/``format()`` give the value), and msgspec encodes it as that string, so the JSON
of a state and every comparison with a plain string are unchanged. Ids and LSNs are the ``NewType``s
of :mod:`reel.shared.core.run.ids` (plain ``str`` / ``int`` on the wire).

The state types are frozen; their maps are :class:`~reel.shared.core.run.persistent.FrozenMap` maps and their
sequences tuples (an agent's turns a :class:`~reel.shared.core.run.persistent.FrozenVector`), so its JSON
(:func:`encode_state`) is byte for byte what the earlier ``dict``/``list`` state gave. No state Struct can
hold a reference cycle (each holds only values below it): none is tracked by the cyclic GC (``gc=False``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import TypeVar

import msgspec

from reel.shared.core.agent.turnstate import AgentRecord
from reel.shared.core.input.requeststate import InputRecord
from reel.shared.core.run.events import (
    BlobRef,
    Budget,
    CodeIdentity,
    ContextPartition,
    RunOutcome,
    StepDecl,
    StepHalted,
    TimerReason,
    Usage,
    Verdict,
)
from reel.shared.core.run.forkedits import BranchEdits
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ExecutorId, RunId, StepId
from reel.shared.core.run.persistent import FrozenMap, MapBuilder
from reel.shared.core.run.stepids import cutoff_key, order_key

T = TypeVar("T")


class RunStatus(StrEnum):
    """A run's lifecycle: ``pending → running (⇄ awaiting_input, ⇄ sleeping) → verifying → completed``, or
    ``cancelled``."""

    PENDING = "pending"
    RUNNING = "running"
    AWAITING_INPUT = "awaiting_input"
    SLEEPING = "sleeping"
    VERIFYING = "verifying"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class AttemptStatus(StrEnum):
    """An attempt's record: its intent is committed (``dispatched``), then exactly one outcome.

    ``cancelled``: the run's cancel stopped it (``attempt_cancelled``); not a failure, never
    counted against ``max_attempts``.
    """

    DISPATCHED = "dispatched"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepStatus(StrEnum):
    """A step's status on one branch, derived from its attempts (:func:`reel.shared.core.run.state.step_statuses`)."""

    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    AWAITING_INPUT = "awaiting_input"  # a tool call whose input request is open
    SLEEPING = "sleeping"  # the step a sleeping run's timer waits on (views only: its sleep, or its resume_after)


# The members again as module names, for the per-step loops below and in the fold: reading
# ``AttemptStatus.SUCCEEDED`` goes through the enum's metaclass (~90 ns on CPython 3.11), a global ~10 ns.
PENDING, RUNNING, VERIFYING = RunStatus.PENDING, RunStatus.RUNNING, RunStatus.VERIFYING
COMPLETED, CANCELLED, AWAITING_INPUT = RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.AWAITING_INPUT
SLEEPING = RunStatus.SLEEPING
DISPATCHED, SUCCEEDED, FAILED = AttemptStatus.DISPATCHED, AttemptStatus.SUCCEEDED, AttemptStatus.FAILED
ATTEMPT_CANCELLED, STEP_CANCELLED = AttemptStatus.CANCELLED, StepStatus.CANCELLED
STEP_PENDING, STEP_RUNNING, STEP_RETRYING = StepStatus.PENDING, StepStatus.RUNNING, StepStatus.RETRYING
STEP_SUCCEEDED, STEP_FAILED, STEP_SKIPPED = StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED

INTERRUPTED = "interrupted"
"""``error_kind`` of an attempt its executor interrupted at shutdown (the drain deadline passed): retryable,
and not a try of the step (never counted against ``max_attempts``); another executor runs a new attempt."""
RESUME_AFTER = "resume_after"
"""``error_kind`` of an attempt whose tool asked to be run again later (``reel.resume_after``, or a command's
``{"reel": {"resume_after_s": N}}`` stdout): not a try of the step; its ``resume_at_ms`` says when."""

LIVE: frozenset[RunStatus] = frozenset({PENDING, RUNNING, AWAITING_INPUT, SLEEPING, VERIFYING})
"""Statuses a run can leave: cancel is legal in each."""
DRIVABLE: frozenset[RunStatus] = frozenset({RunStatus.PENDING, RunStatus.RUNNING})
"""Statuses in which an executor drives the run."""
RESTING: frozenset[RunStatus] = frozenset({AWAITING_INPUT, SLEEPING, VERIFYING, COMPLETED, CANCELLED})
"""Statuses in which no executor drives the run."""
STEP_TERMINAL: frozenset[StepStatus] = frozenset({StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED})
"""Step statuses that no further attempt changes (a branch whose steps are all terminal is done)."""


class Steps(tuple[StepDecl, ...]):
    """The run's step declarations in workflow order: a ``tuple`` that also knows each step's position.

    Built once per run (when the run is created or its state decoded), so position and
    declaration lookups are O(1) with no cache anywhere. Encodes as the JSON array of a tuple.
    """

    _index: dict[StepId, int]

    def __new__(cls, decls: Iterable[StepDecl] = ()) -> Steps:
        self = super().__new__(cls, decls)
        self._index = {d.step_id: i for i, d in enumerate(self)}
        return self

    def position(self, step_id: StepId) -> int:
        """0-based position of ``step_id``. Raises KeyError."""
        return self._index[step_id]

    def declares(self, step_id: str) -> bool:
        """Whether ``step_id`` is a step of the workflow."""
        return step_id in self._index

    @property
    def positions(self) -> Mapping[StepId, int]:
        """Step id → position (for :func:`reel.shared.core.run.stepids.order_key`); read only."""
        return self._index


class AttemptState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
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
    truncated: bool | msgspec.UnsetType = msgspec.UNSET  # the output is a head (attempt_succeeded.truncated)
    finish_reason: str | msgspec.UnsetType | None = msgspec.UNSET  # a model attempt's, as the server sent it
    error_ref: BlobRef | msgspec.UnsetType = msgspec.UNSET  # the whole body behind a failure (attempt_failed)
    code: CodeIdentity | msgspec.UnsetType = msgspec.UNSET  # the code it ran (attempt_dispatched.code)
    resume_at_ms: int | msgspec.UnsetType = msgspec.UNSET  # a resume_after failure: when the tool runs again
    workspace: BlobRef | msgspec.UnsetType = msgspec.UNSET  # the workspace manifest the outcome recorded


class Timer(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A branch's latest timer (``run_sleeping``), and its firing (``run_woke``) once it fired.

    Attributes:
        step_id: the sleep step, or the step whose attempt asked to be resumed; reason: ``sleep`` or
            ``resume_after``; wake_ms: when it is due (epoch ms); set_lsn: the ``run_sleeping`` commit.
        woke_lsn, woke_ms: the ``run_woke`` commit and its time (epoch ms); ``None`` while it sleeps.
    """

    step_id: StepId
    reason: TimerReason
    wake_ms: int
    set_lsn: LSN
    woke_lsn: LSN | None = None
    woke_ms: int | None = None


class BranchState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One line of history of a run; ``attempts``: step id → its attempts, in dispatch order (an agent's turns and
    calls too); ``agents``: the agent steps' declarations and outcomes (:mod:`reel.shared.core.agent.turnfold`);
    ``requests``:
    the input requests by call step id (:mod:`reel.shared.core.input.requestfold`) — the last two unset (not encoded) if
    none; ``halt``: the ``step_halted`` that ended the branch (its step fails), unset (not encoded) if none;
    ``timer``: its latest timer (:class:`Timer`), unset (not encoded) if it never slept."""

    branch_id: BranchId
    parent_branch_id: BranchId | None = None
    fork_lsn: LSN | None = None
    from_step: StepId | None = None
    created_lsn: LSN
    attempts: FrozenMap[StepId, tuple[AttemptState, ...]] = FrozenMap()
    agents: FrozenMap[StepId, AgentRecord] | msgspec.UnsetType = msgspec.UNSET
    requests: FrozenMap[StepId, InputRecord] | msgspec.UnsetType = msgspec.UNSET
    forked_by: str | msgspec.UnsetType = msgspec.UNSET  # BranchForked.by: who rewound (unset: not named)
    halt: StepHalted | msgspec.UnsetType = msgspec.UNSET
    timer: Timer | msgspec.UnsetType = msgspec.UNSET
    edits: tuple[BranchEdits, ...] | msgspec.UnsetType = msgspec.UNSET  # fork edits in force (forkedits.carried)


class RunState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything known about one run at ``head_lsn``: immutable, shared structurally between LSNs.

    Its collections are tuples and :class:`~reel.shared.core.run.persistent.FrozenMap` maps, so a state
    handed out can never change under its holder; the fold derives the next state without
    copying the unchanged parts (see :mod:`reel.shared.core.run.fold`). Encode and decode it with
    :func:`encode_state` / :func:`decode_state` (msgspec needs the hooks for ``FrozenMap``).
    """

    run_id: RunId
    status: RunStatus
    workflow_name: str
    workflow_ref: BlobRef
    steps: Steps
    verifiers: tuple[str, ...] = ()
    idempotency_key: str | None = None
    labels: FrozenMap[str, str] = FrozenMap()
    created_ms: int
    created_lsn: LSN
    head_lsn: LSN
    commits: int = 0
    executor_id: ExecutorId | None = None
    active_branch: BranchId
    branches: FrozenMap[BranchId, BranchState] = FrozenMap()
    verifying_lsn: LSN | None = None
    verifying_branch: BranchId | None = None
    verdicts: tuple[Verdict, ...] = ()
    outcome: RunOutcome | None = None
    cancel_reason: str | None = None
    cancelled_by: str | msgspec.UnsetType = msgspec.UNSET  # RunCancelled.by: who cancelled (unset: not named)
    finished_ms: int | None = None
    source_dir: str | msgspec.UnsetType = msgspec.UNSET  # RunCreated.source_dir (unset: not encoded)
    budget: Budget | msgspec.UnsetType = msgspec.UNSET  # RunCreated.budget (unset: not encoded)
    workspace: BlobRef | msgspec.UnsetType = msgspec.UNSET  # RunCreated.workspace: every branch's first manifest
    # (unset: the run has no workspace, and none of its attempts records one)

    @property
    def active(self) -> BranchState:
        """The active branch's state (``branches[active_branch]``)."""
        return self.branches[self.active_branch]

    @property
    def tool_source_dir(self) -> str | None:
        """The workflow file's folder the run's ``python:`` tools are looked up in first (``None``: none given)."""
        return self.source_dir if isinstance(self.source_dir, str) else None

    def step_decl(self, step_id: StepId) -> StepDecl:
        """The declaration of ``step_id`` (O(1)).

        Raises:
            KeyError: unknown step.
        """
        return self.steps[self.steps.position(step_id)]

    def step_index(self, step_id: StepId) -> int:
        """Position of ``step_id`` in the workflow (0-based, O(1)). Raises KeyError."""
        return self.steps.position(step_id)


# ---- derived facts (pure) -------------------------------------------------------------------------


def step_statuses(state: RunState, branch_id: BranchId) -> list[StepStatus]:
    """Derived status of every step of one branch, in workflow order, in one pass.

    ``skipped`` follows a step that failed after its last attempt.
    """
    branch = state.branches[branch_id]
    out: list[StepStatus] = []
    failed_before = False
    for decl in state.steps:
        if failed_before:
            out.append(STEP_SKIPPED)
            continue
        status = own_status(branch, decl)
        failed_before = status == STEP_FAILED
        out.append(status)
    return out


def step_status(state: RunState, branch_id: BranchId, step_id: StepId) -> StepStatus:
    """Derived status of one step on one branch (see :func:`step_statuses`). Raises KeyError."""
    return step_statuses(state, branch_id)[state.step_index(step_id)]


def final_success(attempts: Sequence[AttemptState]) -> AttemptState | None:
    """The attempt whose output counts: the last non-recovered success, else the last success.

    A recovered success is a superseded attempt's late outcome; the attempt that
    replaced it is what the run went on with.
    """
    wins = [a for a in attempts if a.status == SUCCEEDED]
    own = [a for a in wins if not a.recovered]
    return own[-1] if own else (wins[-1] if wins else None)


def own_status(branch: BranchState, decl: StepDecl) -> StepStatus:
    """Status of one step from its own records on ``branch`` (not ``skipped``: see :func:`step_statuses`); a step
    the branch halted at (``step_halted``) is ``failed``."""
    if branch.halt is not msgspec.UNSET and branch.halt.step_id == decl.step_id:
        return STEP_FAILED
    if decl.kind == "agent":
        return agent_status(branch, decl.step_id)
    return attempts_status(branch.attempts.get(decl.step_id), decl.max_attempts)


def agent_status(branch: BranchState, step_id: StepId) -> StepStatus:
    """Status of an agent step: from its ``agent_finished``, else ``running`` once a turn is declared."""
    rec = None if branch.agents is msgspec.UNSET else branch.agents.get(step_id)
    if rec is None or (not rec.turns and rec.finished is None):
        return STEP_PENDING
    return StepStatus(rec.finished.status) if rec.finished is not None else STEP_RUNNING


def attempts_status(attempts: Sequence[AttemptState] | None, max_attempts: int) -> StepStatus:
    """Status of one step from its attempts (see :func:`step_statuses`); an agent's turns and calls use it too."""
    if not attempts:
        return STEP_PENDING
    if any(a.status == SUCCEEDED for a in attempts):
        return STEP_SUCCEEDED
    last = attempts[-1]
    if last.status == DISPATCHED:
        return STEP_RUNNING
    if last.status == ATTEMPT_CANCELLED:  # the run's cancel stopped it (a re-driven step gets a new attempt)
        return STEP_CANCELLED
    # a superseded attempt (its executor died, a later attempt replaced it) was not a try of the step:
    # recovery's late verdict on it does not count against max_attempts; nor does an attempt interrupted
    # by its executor's shutdown, nor a cancelled one, nor one whose tool asked to be resumed later
    failed = sum(1 for a in attempts if a.status == FAILED and a.error_kind not in (INTERRUPTED, RESUME_AFTER)
                 and not (a.recovered and a is not last))
    if not last.retryable or failed >= max_attempts:
        return STEP_FAILED
    return STEP_RETRYING


def inherited(steps: Steps, parent: BranchState, fork_lsn: LSN, from_step: StepId | None
              ) -> FrozenMap[StepId, tuple[AttemptState, ...]]:
    """What a branch forked from ``parent`` at ``fork_lsn`` (keeping only the steps before ``from_step``) inherits.

    The parent's attempts dispatched at or below ``fork_lsn``; one whose outcome came later
    is inherited still open (``dispatched``). Records unchanged by then are shared, not copied.
    """
    positions = steps.positions
    cutoff = cutoff_key(positions, from_step)
    out: MapBuilder[StepId, tuple[AttemptState, ...]] = MapBuilder()
    for step_id, attempts in parent.attempts.items():
        if order_key(positions, step_id) >= cutoff:  # an agent's turns and calls sort after the agent
            continue
        kept: list[AttemptState] = []
        for a in attempts:
            if a.dispatched_lsn > fork_lsn:
                continue
            if a.outcome_lsn is not None and a.outcome_lsn > fork_lsn:  # its outcome came later: still open
                a = msgspec.structs.replace(a, status=DISPATCHED, outcome_lsn=None, finished_ms=None, output_ref=None,
                                            usage=Usage(), error_kind=None, error_message=None, retryable=True,
                                            recovered=False, resume_at_ms=msgspec.UNSET,
                                            workspace=msgspec.UNSET)
            kept.append(a)
        if kept:
            out[step_id] = tuple(kept)
    return out.finish()


def branch_terminal(state: RunState, branch_id: BranchId) -> bool:
    """True when every step of the branch is succeeded, failed or skipped."""
    return all(s in STEP_TERMINAL for s in step_statuses(state, branch_id))


def branch_failed(state: RunState, branch_id: BranchId) -> bool:
    """True when some step of the branch failed after its last attempt."""
    return STEP_FAILED in step_statuses(state, branch_id)


def workspace_as_of(state: RunState, branch_id: BranchId, upto_lsn: int | None = None) -> BlobRef | None:
    """The manifest of ``branch_id``'s workspace as of ``upto_lsn`` (default: the state's head): the one the
    latest outcome at or below it recorded among the branch's attempts (a forked branch's include what it
    inherited, cut at its fork point), else the run's first one (``run_created``); ``None``: no workspace.

    Raises:
        KeyError: unknown branch.
    """
    best: tuple[int, BlobRef] | None = None
    for attempts in state.branches[branch_id].attempts.values():
        for a in attempts:
            ws, at = a.workspace, a.outcome_lsn
            if isinstance(ws, BlobRef) and at is not None and (upto_lsn is None or at <= upto_lsn) \
                    and (best is None or at > best[0]):
                best = (at, ws)
    if best is not None:
        return best[1]
    return state.workspace if isinstance(state.workspace, BlobRef) else None
