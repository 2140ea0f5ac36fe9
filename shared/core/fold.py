"""State is a pure fold of the log (brief §4).

``fold(commits)`` turns the ordered ``(lsn, Commit)`` pairs of one run into a
:class:`RunState`. It reads no clock, does no I/O, draws no randomness and logs
nothing: the same commits always give an equal state, which is what lets any
materialized state be checked against a cold re-fold
(:func:`tests.refold.assert_refold_identical`).

``RunState`` is owned by whoever folded it (it is mutated in place by
:func:`apply` for speed: O(1) per event). Anything handed to other code — the
``EpisodeView`` of a verifier above all — is a frozen copy (:mod:`shared.core.views`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

from shared.core import agentfold
from shared.core.errors import InvalidTransition
from shared.core.events import (
    AgentFinished,
    AnyEvent,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BranchForked,
    Commit,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunStarted,
    RunVerifying,
    StepDecl,
    StepsDeclared,
    Usage,
    VerdictRecorded,
)
from shared.core.ids import LSN, AttemptNo, BranchId, StepId
from shared.core.state import (
    DRIVABLE,
    LIVE,
    RESTING,
    STEP_TERMINAL,
    AttemptState,
    AttemptStatus,
    BranchState,
    RunState,
    RunStatus,
    StepStatus,
    _positions,
)
from shared.core.stepids import order_key

FOLD_VERSION = 1
"""Bump when the fold changes what a log means (with the golden expectations): snapshots written
by another version are ignored."""

__all__ = [
    "DRIVABLE", "FOLD_VERSION", "LIVE", "RESTING", "STEP_TERMINAL", "AttemptState", "AttemptStatus", "BranchState",
    "RunState", "RunStatus", "StepStatus", "apply", "apply_commit", "attempts_status", "branch_failed",
    "branch_terminal", "create", "final_success", "fold", "gc_paused", "step_status", "step_statuses",
]


def _attempt(state: RunState, branch_id: BranchId, step_id: StepId, attempt: AttemptNo) -> AttemptState:
    branch = state.branches.get(branch_id)
    if branch is None:
        raise InvalidTransition(f"unknown branch {branch_id!r}", run_id=state.run_id)
    for a in branch.attempts.get(step_id, ()):
        if a.attempt == attempt:
            return a
    raise InvalidTransition(
        f"outcome for attempt {step_id}#{attempt} on {branch_id} that was never dispatched",
        run_id=state.run_id,
    )


def _inherit(
    state: RunState, parent: BranchState, fork_lsn: LSN, from_step: StepId | None
) -> dict[StepId, list[AttemptState]]:
    """The parent's attempts as of ``fork_lsn`` (and before ``from_step``), deep-copied."""
    positions = _positions(state.steps)
    cutoff = agentfold.cutoff_key(positions, from_step)
    out: dict[StepId, list[AttemptState]] = {}
    for step_id, attempts in parent.attempts.items():
        if order_key(positions, step_id) >= cutoff:
            continue
        kept: list[AttemptState] = []
        for a in attempts:
            if a.dispatched_lsn > fork_lsn:
                continue
            copy = msgspec.structs.replace(a)
            if copy.outcome_lsn is not None and copy.outcome_lsn > fork_lsn:
                copy = msgspec.structs.replace(
                    copy, status=AttemptStatus.DISPATCHED, outcome_lsn=None, finished_ms=None, output_ref=None,
                    usage=Usage(), error_kind=None, error_message=None, retryable=True, recovered=False,
                )
            kept.append(copy)
        if kept:
            out[step_id] = kept
    return out


def create(lsn: LSN, event: RunCreated) -> RunState:
    """The state right after a run's first commit."""
    return RunState(
        run_id=event.run_id,
        status=RunStatus.PENDING,
        workflow_name=event.workflow_name,
        workflow_ref=event.workflow_ref,
        steps=event.steps,
        verifiers=event.verifiers,
        idempotency_key=event.idempotency_key,
        labels=dict(event.labels),
        created_ms=event.created_ms,
        created_lsn=lsn,
        head_lsn=lsn,
        active_branch=event.branch_id,
        branches={event.branch_id: BranchState(branch_id=event.branch_id, created_lsn=lsn)},
    )


def _created(state: RunState, lsn: LSN, event: RunCreated) -> None:
    raise InvalidTransition("run_created on an existing run", run_id=state.run_id)


def _started(state: RunState, lsn: LSN, event: RunStarted) -> None:
    if state.status == RunStatus.PENDING:
        state.status = RunStatus.RUNNING
    state.executor_id = event.executor_id


def _dispatched(state: RunState, lsn: LSN, event: AttemptDispatched) -> None:
    branch = state.branches.get(event.branch_id)
    if branch is None:
        raise InvalidTransition(f"dispatch on unknown branch {event.branch_id!r}", run_id=state.run_id)
    pos = _positions(state.steps).get(event.step_id)
    if state.steps[pos].kind == "agent" if pos is not None else agentfold.declared(branch, event.step_id) is None:
        raise InvalidTransition(f"dispatch of undeclared step {event.step_id!r}", run_id=state.run_id)
    if state.status == RunStatus.PENDING:
        state.status = RunStatus.RUNNING
    branch.attempts.setdefault(event.step_id, []).append(AttemptState(
        step_id=event.step_id, attempt=event.attempt, status=AttemptStatus.DISPATCHED, executor_id=event.executor_id,
        dispatched_lsn=lsn, dispatched_ms=event.at_ms, prompt_ref=event.prompt_ref, context=event.context,
    ))


def _succeeded(state: RunState, lsn: LSN, event: AttemptSucceeded) -> None:
    a = _attempt(state, event.branch_id, event.step_id, event.attempt)
    a.status, a.outcome_lsn, a.finished_ms = AttemptStatus.SUCCEEDED, lsn, event.at_ms
    a.output_ref, a.usage, a.recovered = event.output_ref, event.usage, event.recovered


def _failed(state: RunState, lsn: LSN, event: AttemptFailed) -> None:
    a = _attempt(state, event.branch_id, event.step_id, event.attempt)
    a.status, a.outcome_lsn, a.finished_ms = AttemptStatus.FAILED, lsn, event.at_ms
    a.error_kind, a.error_message, a.retryable = event.error_kind, event.message, event.retryable
    a.usage, a.recovered = event.usage, event.recovered


def _verifying(state: RunState, lsn: LSN, event: RunVerifying) -> None:
    state.status = RunStatus.VERIFYING
    state.verifying_lsn, state.verifying_branch = lsn, event.branch_id


def _verdict(state: RunState, lsn: LSN, event: VerdictRecorded) -> None:
    state.verdicts.append(event.verdict)


def _completed(state: RunState, lsn: LSN, event: RunCompleted) -> None:
    state.status, state.outcome, state.finished_ms = RunStatus.COMPLETED, event.outcome, event.at_ms


def _cancelled(state: RunState, lsn: LSN, event: RunCancelled) -> None:
    state.status, state.cancel_reason, state.finished_ms = RunStatus.CANCELLED, event.reason, event.at_ms


def _forked(state: RunState, lsn: LSN, event: BranchForked) -> None:
    parent = state.branches.get(event.parent_branch_id)
    if parent is None:
        raise InvalidTransition(f"fork of unknown branch {event.parent_branch_id!r}", run_id=state.run_id)
    if event.from_step is not None and not agentfold.is_fork_point(state, event.from_step):
        raise InvalidTransition(f"fork from undeclared step {event.from_step!r}", run_id=state.run_id)
    positions = _positions(state.steps)
    state.branches[event.branch_id] = BranchState(
        branch_id=event.branch_id, parent_branch_id=event.parent_branch_id,
        fork_lsn=event.fork_lsn, from_step=event.from_step, created_lsn=lsn,
        attempts=_inherit(state, parent, event.fork_lsn, event.from_step),
        agents=agentfold.inherit(parent, positions, event.fork_lsn, agentfold.cutoff_key(positions, event.from_step)),
    )
    state.active_branch = event.branch_id
    state.status, state.outcome, state.finished_ms = RunStatus.RUNNING, None, None
    state.verifying_lsn = state.verifying_branch = None


# one case per event type, looked up by type (every event type has one: test_codec checks the union)
_APPLY: dict[type, Callable[[RunState, LSN, Any], None]] = {
    RunCreated: _created, RunStarted: _started, AttemptDispatched: _dispatched, AttemptSucceeded: _succeeded,
    AttemptFailed: _failed, RunVerifying: _verifying, VerdictRecorded: _verdict, RunCompleted: _completed,
    RunCancelled: _cancelled, BranchForked: _forked, StepsDeclared: agentfold.apply_declared,
    AgentFinished: agentfold.apply_finished,
}


def apply(state: RunState, lsn: LSN, event: AnyEvent) -> RunState:
    """Apply one event committed at ``lsn``; returns ``state`` (mutated in place).

    Raises:
        InvalidTransition: the event is structurally impossible on this state
            (an outcome for an attempt never dispatched, an unknown branch…).
    """
    _APPLY[type(event)](state, lsn, event)
    return state


def apply_commit(state: RunState | None, lsn: int, commit: Commit) -> RunState:
    """Apply every event of one commit (all or nothing is the log's job: one message) at ``lsn``.

    Raises:
        InvalidTransition: the first commit of a run is not ``run_created``, or see :func:`apply`.
    """
    at, events = LSN(lsn), commit.events
    if state is None:
        if not events or not isinstance(events[0], RunCreated):
            raise InvalidTransition("a run's first commit must start with run_created", run_id=commit.run_id)
        state, events = create(at, events[0]), events[1:]
    for event in events:
        _APPLY[type(event)](state, at, event)
    state.head_lsn = at
    state.commits += 1
    return state


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a fold builds many long-lived objects.

    A fold allocates thousands of objects that all survive; the collector would
    rescan them again and again (dozens of full passes for a 10,000-commit run)
    without ever freeing one. Synchronous code only: nothing else runs meanwhile.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def fold(commits: Iterable[tuple[int, Commit]], upto_lsn: int | None = None) -> RunState | None:
    """Fold ``(lsn, commit)`` pairs in LSN order; stop after ``upto_lsn`` if given.

    Returns ``None`` when there is no commit at or below ``upto_lsn``.
    """
    state: RunState | None = None
    with gc_paused():
        for lsn, commit in commits:
            if upto_lsn is not None and lsn > upto_lsn:
                break
            state = apply_commit(state, lsn, commit)
    return state


# ---- derived facts (pure) -------------------------------------------------


def step_statuses(state: RunState, branch_id: BranchId) -> list[StepStatus]:
    """Derived status of every step of one branch, in workflow order, in one pass.

    ``skipped`` follows a step that failed after its last attempt.
    """
    branch = state.branches[branch_id]
    out: list[StepStatus] = []
    failed_before = False
    for decl in state.steps:
        if failed_before:
            out.append(StepStatus.SKIPPED)
            continue
        status = _own_status(branch, decl)
        failed_before = status == StepStatus.FAILED
        out.append(status)
    return out


def step_status(state: RunState, branch_id: BranchId, step_id: StepId) -> StepStatus:
    """Derived status of one step on one branch (see :func:`step_statuses`). Raises KeyError."""
    return step_statuses(state, branch_id)[state.step_index(step_id)]


def final_success(attempts: list[AttemptState]) -> AttemptState | None:
    """The attempt whose output counts: the last non-recovered success, else the last success.

    A recovered success is a superseded attempt's late outcome; the attempt that
    replaced it is what the run went on with.
    """
    wins = [a for a in attempts if a.status == AttemptStatus.SUCCEEDED]
    own = [a for a in wins if not a.recovered]
    return own[-1] if own else (wins[-1] if wins else None)


def _own_status(branch: BranchState, decl: StepDecl) -> StepStatus:
    if decl.kind == "agent":
        return agentfold.agent_status(branch, decl.step_id)
    return attempts_status(branch.attempts.get(decl.step_id), decl.max_attempts)


def attempts_status(attempts: list[AttemptState] | None, max_attempts: int) -> StepStatus:
    """Status of one step from its attempts (see :func:`step_statuses`); an agent's turns and calls use it too."""
    if not attempts:
        return StepStatus.PENDING
    if any(a.status == AttemptStatus.SUCCEEDED for a in attempts):
        return StepStatus.SUCCEEDED
    last = attempts[-1]
    if last.status == AttemptStatus.DISPATCHED:
        return StepStatus.RUNNING
    # a superseded attempt (its executor died, a later attempt replaced it) was not a try of the step:
    # recovery's late verdict on it does not count against max_attempts
    failed = sum(1 for a in attempts if a.status == AttemptStatus.FAILED and not (a.recovered and a is not last))
    if not last.retryable or failed >= max_attempts:
        return StepStatus.FAILED
    return StepStatus.RETRYING


def branch_terminal(state: RunState, branch_id: BranchId) -> bool:
    """True when every step of the branch is succeeded, failed or skipped (brief §2)."""
    return all(s in STEP_TERMINAL for s in step_statuses(state, branch_id))


def branch_failed(state: RunState, branch_id: BranchId) -> bool:
    """True when some step of the branch failed after its last attempt."""
    return StepStatus.FAILED in step_statuses(state, branch_id)
