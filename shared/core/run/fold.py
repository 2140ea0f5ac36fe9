"""State is a pure fold of the log.

``fold(commits)`` turns the ordered ``(lsn, Commit)`` pairs of one run into a :class:`RunState`;
``apply_commit(state, lsn, commit)`` gives the state one commit later. No clock, I/O, randomness or
logging: the same commits always give an equal state, so any materialized state can be checked
against a cold re-fold (agent and human-input cases: :mod:`reel.shared.core.agent.turnfold`, ``inputfold``).

**The state handed out is immutable** (:mod:`reel.shared.core.run.state`), like the crucible's session fold: a
holder's state never changes; the next state is a new value. Inside, the fold works on a private
mutable accumulator (:class:`_Run`, a :class:`_Branch` per branch it touches) and publishes once per
call, sharing every untouched branch, step tuple and attempt record with the previous state; a touched
map costs one trie path (O(log₃₂ steps)). So one new commit costs O(1) in the run's length
(``bench/fold_step.py``; docs/architecture.md, "State is a fold"). Pausing the GC during long loads
is the adapter's business (:mod:`reel.shared.nats.eventlog`), not this one's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.agent.turnstate import AgentRecord
from reel.shared.core.errors import InvalidTransition
from reel.shared.core.input import requestfold
from reel.shared.core.input.requestevents import InputAnswered, InputRequested, RunAwaitingInput
from reel.shared.core.run import lifecycle
from reel.shared.core.run.events import (
    AgentFinished,
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BranchForked,
    Commit,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunSleeping,
    RunStarted,
    RunVerifying,
    RunWoke,
    StepHalted,
    StepsDeclared,
    Verdict,
    VerdictRecorded,
)
from reel.shared.core.run.forkedits import BranchEdits, carried
from reel.shared.core.run.ids import LSN, BranchId, StepId
from reel.shared.core.run.persistent import FrozenMap
from reel.shared.core.run.state import (
    ATTEMPT_CANCELLED,
    DISPATCHED,
    FAILED,
    PENDING,
    RUNNING,
    SLEEPING,
    SUCCEEDED,
    VERIFYING,
    AttemptState,
    BranchState,
    RunState,
    Steps,
    Timer,
    inherited,
)
from reel.shared.core.run.stepids import cutoff_key, parse_step_id

FOLD_VERSION = 1
"""Bump when the fold changes what a log means (with the golden expectations); other versions' snapshots are ignored."""

__all__ = ["FOLD_VERSION", "apply", "apply_commit", "create", "fold"]

Attempts = tuple[AttemptState, ...]


class _Branch:
    """One branch while the fold touches it: its last published state plus the steps (and agent records) changed
    since, in plain ``dict`` overlays (cheap to write) that :meth:`freeze` merges into the published maps."""

    __slots__ = ("agents", "base", "changed")

    def __init__(self, base: BranchState) -> None:
        self.base = base
        self.changed: dict[StepId, Attempts] = {}
        self.agents: dict[StepId, AgentRecord] = {}

    def agent(self, step_id: StepId) -> AgentRecord | None:
        """The agent step's record as folded so far (``None`` before its first declaration)."""
        found = self.agents.get(step_id)
        return found if found is not None else turnfold.record(self.base, step_id)

    def get(self, step_id: StepId) -> Attempts:
        """The step's attempts as folded so far (``()`` if none)."""
        found = self.changed.get(step_id)
        return found if found is not None else self.base.attempts.get(step_id, ())

    def freeze(self) -> BranchState:
        """The branch as folded so far, published (the overlay is emptied)."""
        if self.changed:
            self.base = msgspec.structs.replace(self.base, attempts=self.base.attempts.merged(self.changed))
            self.changed = {}
        if self.agents:
            agents = self.base.agents if self.base.agents is not msgspec.UNSET else FrozenMap()
            self.base = msgspec.structs.replace(self.base, agents=agents.merged(self.agents))
            self.agents = {}
        return self.base


class _Run:
    """The fold's private, mutable working copy of one run: the fields events change, over a frozen base."""

    __slots__ = ("active_branch", "base", "cancel_reason", "cancelled_by", "commits", "executor_id", "finished_ms",
                 "head_lsn", "outcome", "status", "touched", "verdicts", "verifying_branch", "verifying_lsn")

    def __init__(self, base: RunState) -> None:
        self.base = base
        self.status, self.executor_id, self.active_branch = base.status, base.executor_id, base.active_branch
        self.verifying_lsn, self.verifying_branch = base.verifying_lsn, base.verifying_branch
        self.outcome, self.cancel_reason, self.finished_ms = base.outcome, base.cancel_reason, base.finished_ms
        self.cancelled_by = base.cancelled_by
        self.head_lsn, self.commits = base.head_lsn, base.commits
        self.verdicts: list[Verdict] = []  # recorded since ``base``
        self.touched: dict[BranchId, _Branch] = {}  # branches changed (or created) since ``base``

    def branch(self, branch_id: BranchId) -> _Branch | None:
        b = self.touched.get(branch_id)
        if b is None:
            base = self.base.branches.get(branch_id)
            if base is None:
                return None
            b = self.touched[branch_id] = _Branch(base)
        return b

    def freeze(self) -> RunState:
        """Publish: a frozen RunState sharing everything unchanged with ``base`` (O(touched branches))."""
        branches = self.base.branches
        if self.touched:
            branches = branches.merged({bid: b.freeze() for bid, b in self.touched.items()})
        verdicts = self.base.verdicts + tuple(self.verdicts) if self.verdicts else self.base.verdicts
        return msgspec.structs.replace(
            self.base, status=self.status, executor_id=self.executor_id, active_branch=self.active_branch,
            verifying_lsn=self.verifying_lsn, verifying_branch=self.verifying_branch, outcome=self.outcome,
            cancel_reason=self.cancel_reason, cancelled_by=self.cancelled_by, finished_ms=self.finished_ms,
            head_lsn=self.head_lsn, commits=self.commits, verdicts=verdicts, branches=branches)


def _on(run: _Run, branch_id: BranchId, what: str) -> _Branch:
    """The branch an event of kind ``what`` names. Raises InvalidTransition: no such branch."""
    branch = run.branch(branch_id)
    if branch is None:
        raise InvalidTransition(f"{what} on unknown branch {branch_id!r}", run_id=run.base.run_id)
    return branch


def _found(run: _Run, branch_id: BranchId, step_id: StepId, attempt: int) -> tuple[_Branch, Attempts, int]:
    branch = _on(run, branch_id, "outcome")
    attempts = branch.get(step_id)
    for i, a in enumerate(attempts):
        if a.attempt == attempt:
            return branch, attempts, i
    raise InvalidTransition(f"outcome for attempt {step_id}#{attempt} on {branch_id} that was never dispatched",
                            run_id=run.base.run_id)


def create(lsn: LSN, event: RunCreated) -> RunState:
    """The state right after a run's first commit."""
    return RunState(
        run_id=event.run_id, status=PENDING, workflow_name=event.workflow_name,
        workflow_ref=event.workflow_ref, steps=Steps(event.steps), verifiers=event.verifiers,
        idempotency_key=event.idempotency_key, labels=FrozenMap.of(event.labels), created_ms=event.created_ms,
        created_lsn=lsn, head_lsn=lsn, active_branch=event.branch_id,
        branches=FrozenMap.of({event.branch_id: BranchState(branch_id=event.branch_id, created_lsn=lsn)}),
        source_dir=event.source_dir, budget=event.budget, workspace=event.workspace,
    )


def _created(run: _Run, lsn: LSN, event: RunCreated) -> None:
    raise InvalidTransition("run_created on an existing run", run_id=run.base.run_id)


def _started(run: _Run, lsn: LSN, event: RunStarted) -> None:
    run.status, run.executor_id = RUNNING if run.status == PENDING else run.status, event.executor_id


def _dispatched(run: _Run, lsn: LSN, event: AttemptDispatched) -> None:
    branch = _on(run, event.branch_id, "dispatch")
    steps = run.base.steps
    if steps.declares(event.step_id):  # a workflow step (an agent step itself is never dispatched)
        undeclared = steps[steps.position(event.step_id)].kind == "agent"
    else:  # a turn or call of an agent step, declared by steps_declared
        parsed = parse_step_id(event.step_id)
        undeclared = parsed is None or turnfold.entry_in(branch.agent(parsed[0]), parsed) is None
    if undeclared:
        raise InvalidTransition(f"dispatch of undeclared step {event.step_id!r}", run_id=run.base.run_id)
    run.status = RUNNING if run.status == PENDING else run.status
    branch.changed[event.step_id] = (*branch.get(event.step_id), AttemptState(
        step_id=event.step_id, attempt=event.attempt, status=DISPATCHED, executor_id=event.executor_id,
        dispatched_lsn=lsn, dispatched_ms=event.at_ms, prompt_ref=event.prompt_ref, context=event.context,
        code=event.code))


def _resolved(run: _Run, lsn: LSN, event: AttemptSucceeded | AttemptFailed | AttemptCancelled, **outcome: Any) -> None:
    branch, attempts, i = _found(run, event.branch_id, event.step_id, event.attempt)
    done = msgspec.structs.replace(attempts[i], outcome_lsn=lsn, finished_ms=event.at_ms, usage=event.usage,
                                   recovered=event.recovered, **outcome)
    branch.changed[event.step_id] = (*attempts[:i], done, *attempts[i + 1:])


def _succeeded(run: _Run, lsn: LSN, event: AttemptSucceeded) -> None:
    _resolved(run, lsn, event, status=SUCCEEDED, output_ref=event.output_ref, truncated=event.truncated,
              finish_reason=event.finish_reason, workspace=event.workspace)


def _failed(run: _Run, lsn: LSN, event: AttemptFailed) -> None:
    _resolved(run, lsn, event, status=FAILED, error_kind=event.error_kind, error_message=event.message,
              retryable=event.retryable, finish_reason=event.finish_reason, error_ref=event.error_ref,
              resume_at_ms=event.resume_at_ms, workspace=event.workspace)


def _attempt_cancelled(run: _Run, lsn: LSN, event: AttemptCancelled) -> None:
    _resolved(run, lsn, event, status=ATTEMPT_CANCELLED, error_kind=ATTEMPT_CANCELLED.value, error_message=event.reason)


def _verifying(run: _Run, lsn: LSN, event: RunVerifying) -> None:
    run.status, run.verifying_lsn, run.verifying_branch = VERIFYING, lsn, event.branch_id


def _verdict(run: _Run, lsn: LSN, event: VerdictRecorded) -> None:
    run.verdicts.append(lifecycle.verdict(run, lsn, event))


def _completed(run: _Run, lsn: LSN, event: RunCompleted) -> None:
    run.status, run.outcome, run.finished_ms = lifecycle.completed(run, event), event.outcome, event.at_ms


def _cancelled(run: _Run, lsn: LSN, event: RunCancelled) -> None:
    run.status, run.cancel_reason, run.finished_ms = lifecycle.cancelled(run), event.reason, event.at_ms
    run.cancelled_by = event.by
    active = _on(run, run.active_branch, "run_cancelled")  # its open input requests close with the run
    active.base = requestfold.close_open(active.base, lsn)


def _forked(run: _Run, lsn: LSN, event: BranchForked) -> None:
    parent = _on(run, event.parent_branch_id, "fork")
    if event.from_step is not None and not turnfold.is_fork_point(run.base, event.from_step):
        raise InvalidTransition(f"fork from undeclared step {event.from_step!r}", run_id=run.base.run_id)
    steps, frozen = run.base.steps, parent.freeze()
    cutoff = cutoff_key(steps.positions, event.from_step)
    run.touched[event.branch_id] = _Branch(BranchState(
        branch_id=event.branch_id, parent_branch_id=event.parent_branch_id,
        fork_lsn=event.fork_lsn, from_step=event.from_step, created_lsn=lsn, forked_by=event.by,
        attempts=inherited(steps, frozen, event.fork_lsn, event.from_step),
        agents=turnfold.inherit(frozen, steps.positions, event.fork_lsn, cutoff),
        requests=requestfold.inherit(frozen, steps.positions, event.fork_lsn, cutoff),
        edits=_edits(steps.positions, frozen, event),
    ))
    run.active_branch = event.branch_id
    run.status, run.outcome, run.finished_ms = RUNNING, None, None
    run.verifying_lsn = run.verifying_branch = None


def _edits(positions: Mapping[StepId, int], parent: BranchState,
           event: BranchForked) -> tuple[BranchEdits, ...] | msgspec.UnsetType:
    """The fork edits in force on the branch ``event`` creates (unset when none: older logs fold unchanged)."""
    own = event.edits if isinstance(event.edits, tuple) else ()
    mine = carried(positions, parent.edits if isinstance(parent.edits, tuple) else (), parent.created_lsn,
                   event.fork_lsn, event.from_step, own)
    return mine or msgspec.UNSET


def _declared(run: _Run, lsn: LSN, event: StepsDeclared) -> None:
    branch = _on(run, event.branch_id, "steps_declared")
    step = event.parent_step
    branch.agents[step] = turnfold.declare(run.base.steps, branch.agent(step), event, lsn, run.base.run_id)


def _agent_finished(run: _Run, lsn: LSN, event: AgentFinished) -> None:
    branch = _on(run, event.branch_id, "agent_finished")
    step = event.step_id
    branch.agents[step] = turnfold.finish(run.base.steps, branch.agent(step), event, lsn, run.base.run_id)


def _halted(run: _Run, lsn: LSN, event: StepHalted) -> None:
    """The branch stops at ``event.step_id``: that step is failed (:func:`reel.shared.core.run.state.own_status`)."""
    branch = _on(run, event.branch_id, "step_halted")
    steps = run.base.steps
    parsed = parse_step_id(event.step_id)
    known = steps.declares(event.step_id) or (parsed is not None and steps.declares(parsed[0]))
    if not known:
        raise InvalidTransition(f"step_halted at unknown step {event.step_id!r}", run_id=run.base.run_id)
    branch.base = msgspec.structs.replace(branch.base, halt=event)


def _input(run: _Run, lsn: LSN, event: InputRequested | InputAnswered | RunAwaitingInput) -> None:
    """Human input: a request, an answer, the run resting (:func:`reel.shared.core.input.requestfold.apply`)."""
    b = _on(run, event.branch_id, "input event")
    run.status, b.base = requestfold.apply(run.status, run.active_branch, b.base, event, lsn, run.base.run_id,
                                         agent=b.agent, attempts=b.get)


def _sleeping(run: _Run, lsn: LSN, event: RunSleeping) -> None:
    """A timer: the driven run rests in ``sleeping`` on its active branch until ``run_woke``."""
    b = _on(run, event.branch_id, "run_sleeping")
    if run.status != RUNNING or event.branch_id != run.active_branch:
        raise InvalidTransition(f"run_sleeping on a {run.status} run (branch {event.branch_id!r}, active"
                                f" {run.active_branch!r})", run_id=run.base.run_id)
    run.status = SLEEPING
    b.base = msgspec.structs.replace(b.base, timer=Timer(step_id=event.step_id, reason=event.reason,
                                                         wake_ms=event.wake_ms, set_lsn=lsn))


def _woke(run: _Run, lsn: LSN, event: RunWoke) -> None:
    """The timer fired: the run is ``running`` again (only a sleeping run's own timer wakes it)."""
    b = _on(run, event.branch_id, "run_woke")
    timer = b.base.timer
    if run.status != SLEEPING or event.branch_id != run.active_branch or isinstance(timer, msgspec.UnsetType) \
            or timer.step_id != event.step_id:
        raise InvalidTransition(f"run_woke of {event.step_id!r} on a {run.status} run with no such timer",
                                run_id=run.base.run_id)
    run.status = RUNNING
    b.base = msgspec.structs.replace(b.base, timer=msgspec.structs.replace(timer, woke_lsn=lsn, woke_ms=event.at_ms))


# one case per event type, looked up by type (every event type has one: test_codec checks the union)
_APPLY: dict[type, Callable[[_Run, LSN, Any], None]] = {
    RunCreated: _created, RunStarted: _started, AttemptDispatched: _dispatched, AttemptSucceeded: _succeeded,
    AttemptFailed: _failed, RunVerifying: _verifying, VerdictRecorded: _verdict, RunCompleted: _completed,
    RunCancelled: _cancelled, BranchForked: _forked, StepsDeclared: _declared, AgentFinished: _agent_finished,
    AttemptCancelled: _attempt_cancelled, InputRequested: _input, InputAnswered: _input, RunAwaitingInput: _input,
    StepHalted: _halted,
    RunSleeping: _sleeping, RunWoke: _woke,
}


def apply(state: RunState, lsn: LSN, event: AnyEvent) -> RunState:
    """The state after one more event committed at ``lsn`` (``state`` is unchanged; head and count too).

    Raises:
        InvalidTransition: the event is structurally impossible on this state
            (an outcome for an attempt never dispatched, an unknown branch…).
    """
    run = _Run(state)
    _APPLY[type(event)](run, lsn, event)
    return run.freeze()


def _into(run: _Run | None, lsn: int, commit: Commit) -> _Run:
    """Fold one commit into ``run`` (``None``: the run's first commit); returns the accumulator."""
    at, events = LSN(lsn), commit.events
    if run is None:
        if not events or not isinstance(events[0], RunCreated):
            raise InvalidTransition("a run's first commit must start with run_created", run_id=commit.run_id)
        run, events = _Run(create(at, events[0])), events[1:]
    for event in events:
        _APPLY[type(event)](run, at, event)
    run.head_lsn, run.commits = at, run.commits + 1
    return run


def apply_commit(state: RunState | None, lsn: int, commit: Commit) -> RunState:
    """The state after every event of one commit at ``lsn`` (all or nothing is the log's job: one message).

    O(1) in the run's length: the result shares all that the commit did not change with
    ``state``, which itself is left as it was.

    Raises:
        InvalidTransition: the first commit of a run is not ``run_created``, or see :func:`apply`.
    """
    return _into(None if state is None else _Run(state), lsn, commit).freeze()


def fold(commits: Iterable[tuple[int, Commit]], upto_lsn: int | None = None, *,
         start: RunState | None = None) -> RunState | None:
    """Fold ``(lsn, commit)`` pairs in LSN order onto ``start`` (default: nothing yet); stop after ``upto_lsn``.

    One accumulator for all the commits, one published state at the end. Returns
    ``start`` when there is no commit at or below ``upto_lsn`` (``None`` without a start).

    Raises:
        InvalidTransition: see :func:`apply_commit`.
    """
    run: _Run | None = None
    for lsn, commit in commits:
        if upto_lsn is not None and lsn > upto_lsn:
            break
        run = _into(run if run is not None or start is None else _Run(start), lsn, commit)
    return start if run is None else run.freeze()
