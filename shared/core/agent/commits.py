"""The events of each commit of an agent loop: pure builders the executor commits as given.

Each builder reads the folded state at the head the commit will be fenced on, so a
commit never says something the fold refuses (calls declared twice, a second
``agent_finished``…). The actions they serve are in :mod:`reel.shared.core.agent.actions`, whose
docstring is the executor's contract.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.agent.actions import CallAttempt, DispatchCalls, DispatchTurn, InFlight, ResolveUnknown, limits
from reel.shared.core.agent.turnstate import Declared
from reel.shared.core.chat.finish import TRUNCATED
from reel.shared.core.chat.messages import ToolCall, assign_call_ids
from reel.shared.core.input import requestfold, requesting
from reel.shared.core.run import timers
from reel.shared.core.run.events import (
    ARGUMENTS_INLINE_MAX,
    AgentFinished,
    AnyEvent,
    AttemptDispatched,
    AttemptEnd,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    ContextPartition,
    DeclaredStep,
    StepsDeclared,
)
from reel.shared.core.run.ids import AttemptNo, BranchId, ExecutorId, StepId
from reel.shared.core.run.state import AttemptState, AttemptStatus, BranchState, RunState, StepStatus, attempts_status
from reel.shared.core.run.stepids import call_step_id, parse_step_id, turn_step_id
from reel.shared.core.workflow.agentspec import AgentToolSpec, ApprovalPolicy
from reel.shared.core.workflow.spec import AgentStep

OUTCOME_UNKNOWN = "outcome_unknown"


class TurnOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The commit recording a turn's answer.

    Attributes:
        events: to commit, in order.
        started: the calls whose intents ``events`` carries: run them once the commit is acked.
        blobs: bodies of the ``arguments_ref`` blobs (``application/json``): store them with the commit.
    """

    events: tuple[AnyEvent, ...]
    started: tuple[CallAttempt, ...] = ()
    blobs: tuple[bytes, ...] = ()


def json_ref(body: bytes) -> BlobRef:
    """The blob ref of a JSON body (sha256, size in bytes, ``application/json``)."""
    return BlobRef(sha256=hashlib.sha256(body).hexdigest(), size_bytes=len(body), media_type="application/json")


def turn_intent(state: RunState, action: DispatchTurn, *, executor_id: ExecutorId, at_ms: int, prompt_ref: BlobRef,
                context: ContextPartition) -> tuple[AnyEvent, ...]:
    """``[steps_declared(turn) if action.declare, attempt_dispatched(turn, prompt_ref, context)]``."""
    events: list[AnyEvent] = []
    if action.declare:
        decl = DeclaredStep(step_id=action.step_id, kind="turn", turn=action.turn,
                            max_attempts=state.step_decl(action.agent).max_attempts)
        events.append(StepsDeclared(branch_id=action.branch_id, parent_step=action.agent, steps=(decl,)))
    events.append(AttemptDispatched(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                    executor_id=executor_id, at_ms=at_ms, prompt_ref=prompt_ref, context=context))
    return tuple(events)


def next_turn(state: RunState, branch_id: BranchId, agent: StepId) -> DispatchTurn:
    """The turn after the agent's latest one, to declare (for the commit of the latest turn's last result)."""
    rec = turnfold.record(state.branches[branch_id], agent)
    t = (len(rec.turns) if rec is not None else 0) + 1
    return DispatchTurn(branch_id=branch_id, agent=agent, step_id=turn_step_id(agent, t), turn=t,
                        attempt=AttemptNo(1), declare=True)


def declare_calls(agent: AgentStep, turn: int, calls: Sequence[ToolCall]) -> tuple[tuple[DeclaredStep, ...],
                                                                                   tuple[bytes, ...]]:
    """One declaration per call, in order, and the argument bodies too large to carry inline.

    A call to a tool the step does not declare is declared all the same (the executor
    records its attempt as an ``unknown_tool`` error result). Empty or repeated call
    ids within the turn get Reel's (``call_t<turn>_<i>``, :func:`reel.shared.core.chat.messages.assign_call_ids`).
    """
    tools: dict[str, AgentToolSpec] = {t.name: t for t in agent.tools}
    decls: list[DeclaredStep] = []
    blobs: list[bytes] = []
    for i, call in enumerate(assign_call_ids(calls, turn=turn)):
        tool = tools.get(call.name)
        body = call.arguments.encode()
        big = len(body) > ARGUMENTS_INLINE_MAX
        if big:
            blobs.append(body)
        decls.append(DeclaredStep(
            step_id=call_step_id(agent.id, turn, i), kind="tool_call", turn=turn, call_id=call.id, tool_name=call.name,
            arguments=None if big else call.arguments, arguments_ref=json_ref(body) if big else None,
            max_attempts=tool.max_attempts if tool else 1, retry_safe=tool.retry_safe if tool else False,
            fatal=tool.fatal if tool else False,
        ))
    return tuple(decls), tuple(blobs)


def turn_outcome(state: RunState, branch_id: BranchId, agent: AgentStep, turn: int, *, output_ref: BlobRef,
                 calls: Sequence[ToolCall], outcome: AttemptSucceeded | None, executor_id: ExecutorId,
                 at_ms: int, approval: ApprovalPolicy | None = None) -> TurnOutcome:
    """The commit of turn ``turn``'s answer (``outcome``; ``None`` to act on a success already recorded).

    No calls → ``agent_finished`` succeeded with ``output_ref``; calls at ``max_turns`` →
    ``agent_finished`` failed (``max_turns``), calls not declared; else the calls'
    ``steps_declared``, an ``input_requested`` for each call that asks a human first
    (:func:`reel.shared.core.input.requesting.request_events`; ``approval``: the workflow's policy) and the
    intents of the first ``max_parallel_tools`` of the others. Only the outcome when the
    turn was acted on already (or is not the agent's latest).
    """
    events: list[AnyEvent] = [outcome] if outcome is not None else []
    rec = turnfold.record(state.branches[branch_id], StepId(agent.id))
    if rec is None or rec.finished is not None or len(rec.turns) != turn or rec.turns[-1].calls:
        return TurnOutcome(events=tuple(events))
    max_turns, max_parallel = limits(state.step_decl(StepId(agent.id)))
    aid = StepId(agent.id)
    if not calls:
        events.append(AgentFinished(branch_id=branch_id, step_id=aid, status="succeeded", output_ref=output_ref,
                                    turns=turn, at_ms=at_ms))
        return TurnOutcome(events=tuple(events))
    if turn >= max_turns:
        events.append(AgentFinished(branch_id=branch_id, step_id=aid, status="failed", turns=turn,
                                    error_kind="max_turns", at_ms=at_ms,
                                    message=f"turn {turn} asked for {len(calls)} tool call(s) at max_turns"
                                            f" = {max_turns}"))
        return TurnOutcome(events=tuple(events))
    decls, blobs = declare_calls(agent, turn, calls)
    events.append(StepsDeclared(branch_id=branch_id, parent_step=aid, steps=decls))
    asking = requesting.request_events(state.run_id, branch_id, agent, approval, decls, calls, at_ms=at_ms)
    events.extend(asking)
    waiting = {r.step_id for r in asking}
    started = tuple(CallAttempt(d.step_id, AttemptNo(1)) for d in decls if d.step_id not in waiting)[:max_parallel]
    events.extend(AttemptDispatched(branch_id=branch_id, step_id=c.step_id, attempt=c.attempt,
                                    executor_id=executor_id, at_ms=at_ms) for c in started)
    return TurnOutcome(events=tuple(events), started=started, blobs=blobs)


def _status_after(attempts: Sequence[AttemptState], max_attempts: int, outcome: AttemptEnd) -> StepStatus:
    """The step's status once ``outcome`` is applied to its attempt (O(attempts of the step))."""
    done = AttemptStatus.SUCCEEDED if isinstance(outcome, AttemptSucceeded) else AttemptStatus.FAILED
    after = [msgspec.structs.replace(a, status=done, retryable=getattr(outcome, "retryable", True),
                                     error_kind=getattr(outcome, "error_kind", None),
                                     recovered=outcome.recovered) if a.attempt == outcome.attempt else a
             for a in attempts]
    return attempts_status(after, max_attempts)


def turn_failure(state: RunState, failure: AttemptFailed, *, at_ms: int) -> tuple[AnyEvent, ...]:
    """``[attempt_failed]``, plus ``agent_finished`` when the turn has no attempt left after it: ``truncated`` when
    the last attempt's answer was cut (the step's ``on_truncated``), else ``turn_failed``."""
    parsed = parse_step_id(failure.step_id)
    branch = state.branches[failure.branch_id]
    entry = turnfold.entry(branch, failure.step_id)
    rec = turnfold.record(branch, parsed[0]) if parsed else None
    if parsed is None or entry is None or rec is None or rec.finished is not None:
        return (failure,)
    if _status_after(branch.attempts.get(failure.step_id, ()), entry.decl.max_attempts, failure) != StepStatus.FAILED:
        return (failure,)
    kind = TRUNCATED if failure.error_kind == TRUNCATED else "turn_failed"  # a cut answer says so itself
    return (failure, AgentFinished(branch_id=failure.branch_id, step_id=parsed[0], status="failed", turns=parsed[1],
                                   error_kind=kind, at_ms=at_ms,
                                   message=f"turn {parsed[1]} failed: {failure.error_kind}: {failure.message}"))


def call_intents(action: DispatchCalls, *, executor_id: ExecutorId, at_ms: int) -> tuple[AnyEvent, ...]:
    """One ``attempt_dispatched`` per call of ``action`` (one commit: then run them concurrently)."""
    return tuple(AttemptDispatched(branch_id=action.branch_id, step_id=c.step_id, attempt=c.attempt,
                                   executor_id=executor_id, at_ms=at_ms) for c in action.calls)


def _fatal_end(state: RunState, outcomes: Sequence[AttemptEnd], at_ms: int) -> AgentFinished | None:
    """``agent_finished`` (``fatal_tool``) when one of ``outcomes`` fails a fatal tool for good."""
    for o in outcomes:
        parsed = parse_step_id(o.step_id)
        branch = state.branches[o.branch_id]
        decl = turnfold.declared(branch, o.step_id)
        rec = turnfold.record(branch, parsed[0]) if parsed else None
        if not isinstance(o, AttemptFailed) or decl is None or not decl.fatal or rec is None or rec.finished:
            continue
        if parsed and _status_after(branch.attempts.get(o.step_id, ()), decl.max_attempts, o) == StepStatus.FAILED:
            return AgentFinished(branch_id=o.branch_id, step_id=parsed[0], status="failed", turns=parsed[1],
                                 error_kind="fatal_tool", at_ms=at_ms,
                                 message=f"fatal tool {decl.tool_name} failed ({o.step_id}): {o.error_kind}: "
                                         f"{o.message}")
    return None


def call_outcome(state: RunState, outcome: AttemptEnd, *, at_ms: int) -> tuple[AnyEvent, ...]:
    """``[outcome]``, plus ``agent_finished`` (``fatal_tool``) when a fatal tool failed with no attempt left."""
    end = _fatal_end(state, (outcome,), at_ms)
    return (outcome,) if end is None else (outcome, end)


def unknown_outcomes(state: RunState, action: ResolveUnknown, *, at_ms: int) -> tuple[AnyEvent, ...]:
    """``attempt_failed`` (``outcome_unknown``, not retryable) per orphaned call, plus a fatal tool's end."""
    failures = [AttemptFailed(
        branch_id=action.branch_id, step_id=c.step_id, attempt=c.attempt, error_kind=OUTCOME_UNKNOWN, retryable=False,
        at_ms=at_ms, message="the executor running this call died before recording its result; the tool is not"
                             " retry-safe, so it was not run again: whether it took effect is unknown",
    ) for c in action.calls]
    end = _fatal_end(state, failures, at_ms)
    return (*failures, end) if end is not None else tuple(failures)


class _OpenTurn(NamedTuple):
    """The agent's latest turn, still open, that a set of outcomes belongs to (:func:`_open_turn`)."""

    branch_id: BranchId
    branch: BranchState
    agent: StepId
    calls: tuple[Declared, ...]
    outcomes: dict[StepId, AttemptEnd]


def _open_turn(state: RunState, outcomes: Sequence[AttemptEnd]) -> _OpenTurn | None:
    """The turn of ``outcomes`` (calls of one turn; the first names it) when it is its agent's latest, the agent
    has not finished and none of ``outcomes`` fails a fatal tool for good; else ``None``."""
    if not outcomes or _fatal_end(state, outcomes, 0) is not None:
        return None
    first = outcomes[0]
    parsed = parse_step_id(first.step_id)
    branch = state.branches[first.branch_id]
    rec = turnfold.record(branch, parsed[0]) if parsed else None
    if parsed is None or parsed[2] < 0 or rec is None or rec.finished is not None or len(rec.turns) != parsed[1]:
        return None
    return _OpenTurn(first.branch_id, branch, parsed[0], rec.turns[-1].calls, {o.step_id: o for o in outcomes})


def _status_with(attempts: Sequence[AttemptState], max_attempts: int, outcome: AttemptEnd | None) -> StepStatus:
    """The step's status with ``outcome`` (if any) applied to its attempts."""
    if outcome is None:
        return attempts_status(attempts, max_attempts)
    return _status_after(attempts, max_attempts, outcome)


def completes_turn(state: RunState, outcomes: Sequence[AttemptEnd]) -> bool:
    """True when, with ``outcomes`` (calls of one turn) applied, every call of that turn is terminal and none
    is a fatal failure: the commit may then carry the next turn's intent (:func:`next_turn`)."""
    turn = _open_turn(state, outcomes)
    if turn is None:
        return False
    for c in turn.calls:
        gate = requestfold.gate(turn.branch, c.decl.step_id)
        if gate in requestfold.GATE_TERMINAL:
            continue
        if gate == "open":
            return False
        status = _status_with(turn.branch.attempts.get(c.decl.step_id, ()), c.decl.max_attempts,
                              turn.outcomes.get(c.decl.step_id))
        if status not in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            return False
    return True


def follow_up_calls(state: RunState, outcomes: Sequence[AttemptEnd], in_flight: InFlight) -> DispatchCalls | None:
    """The calls of the same turn that the commit of ``outcomes`` should start too (their intents ride
    in that commit, then they run): fresh calls and retries, up to the slots the outcomes free.

    ``None`` when there are none (or the outcomes end the agent). ``in_flight``: as for ``next_action``.
    """
    turn = _open_turn(state, outcomes)
    if turn is None:
        return None
    branch, mine = turn.branch, turn.outcomes
    start: list[CallAttempt] = []
    running = 0
    for c in turn.calls:
        sid = c.decl.step_id
        if requestfold.gate(branch, sid) not in ("none", "approved"):  # waits for a human, or never runs
            continue
        attempts = branch.attempts.get(sid, ())
        o = mine.get(sid)
        if _status_with(attempts, c.decl.max_attempts, o) in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            continue
        if timers.asks_resume(o) or (o is None and attempts and timers.waits(attempts[-1])
                                     and not timers.resumable(branch, attempts[-1])):
            continue                                                      # runs again once its timer fires
        if not attempts:
            start.append(CallAttempt(sid, AttemptNo(1)))
        elif o is not None or attempts[-1].status != AttemptStatus.DISPATCHED:
            start.append(CallAttempt(sid, AttemptNo(attempts[-1].attempt + 1)))    # a retry
        elif (turn.branch_id, sid, attempts[-1].attempt) in in_flight:
            running += 1
    room = limits(state.step_decl(turn.agent))[1] - running
    if not start or room <= 0:
        return None
    return DispatchCalls(branch_id=turn.branch_id, agent=turn.agent, calls=tuple(start[:room]))
