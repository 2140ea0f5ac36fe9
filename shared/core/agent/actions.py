"""The agent loop's pure core: what an executor does next inside a ``kind: agent`` step.

:func:`reel.shared.core.run.planning.next_action` hands an agent step (the first step of the
active branch that is not terminal) to :func:`agent_action`. Everything here reads
the folded state only; the event builders of each commit are in
:mod:`reel.shared.core.agent.commits`, the turn context in :mod:`reel.shared.core.agent.turncontext`.

Contract for the executor driver
--------------------------------
``next_action(state, executor_id, in_flight)`` — ``in_flight`` holds
``(branch_id, step_id, attempt)`` of every attempt this executor has dispatched and
not yet recorded (its running tasks). An attempt still ``dispatched`` in the log and
*not* in ``in_flight`` is an orphan of a dead executor. With ``in_flight`` empty
(the default) nothing is waited for: today's sequential behaviour.

=====================  ======================================================================
action                 what the executor does (the events come from :mod:`~reel.shared.core.agent.commits`)
=====================  ======================================================================
``Wait``               nothing to start: await one of its in-flight tasks, record it, ask again.
``DispatchTurn``       build turn ``turn``'s request (:mod:`~reel.shared.core.agent.turncontext`: candidates →
                       ``pack`` → messages → ``wire_request``), store the body as the prompt blob and
                       commit :func:`~reel.shared.core.agent.commits.turn_intent` (``steps_declared`` of the
                       turn when ``declare``, then ``attempt_dispatched`` with prompt ref and partition)
                       in one round trip; call the model. Answer → output blob (the exact message) +
                       outcome marker, then commit :func:`~reel.shared.core.agent.commits.turn_outcome`:
                       ``[attempt_succeeded, steps_declared(calls), attempt_dispatched × ≤ max_parallel]``
                       — start its ``started`` calls once acked — or ``[attempt_succeeded,
                       agent_finished]`` (no calls: succeeded; calls at ``max_turns``: failed, calls not
                       declared). Error → :func:`~reel.shared.core.agent.commits.turn_failure`
                       (``attempt_failed`` + ``agent_finished`` when it was the last attempt).
``DispatchCalls``      commit :func:`~reel.shared.core.agent.commits.call_intents` (one intent per call, one
                       commit), then run the calls concurrently. Each result → output blob + marker,
                       then :func:`~reel.shared.core.agent.commits.call_outcome` (``attempt_succeeded`` /
                       ``attempt_failed``; + ``agent_finished`` when a ``fatal`` tool failed for good).
                       When :func:`~reel.shared.core.agent.commits.completes_turn` says this result is the
                       turn's last, the same commit should also carry the next turn's intent
                       (:func:`~reel.shared.core.agent.commits.next_turn` + ``turn_intent``, its context built
                       with this outcome passed in ``outcomes``).
                       Otherwise, when the result frees a slot for a call not started yet (or a retry),
                       the commit carries that call's intent too:
                       :func:`~reel.shared.core.agent.commits.follow_up_calls` + ``call_intents``.
``ResolveUnknown``     non-retry-safe calls a dead executor left in flight: commit
                       :func:`~reel.shared.core.agent.commits.unknown_outcomes` (``attempt_failed``,
                       ``outcome_unknown``, not retryable); the model sees it as an error result.
``AdoptTurn``          a turn has a success nothing acted on (recovery recorded it): read its output
                       blob and commit :func:`~reel.shared.core.agent.commits.turn_outcome` with
                       ``outcome=None`` (the declarations and intents only).
``FinishAgent``        the loop is over but the log does not say so (a failure recovery recorded):
                       commit ``action.event(at_ms)``.
``Sleep``              nothing of the turn can run or is running, and calls asked to be run again later
                       (``resume_after``, :mod:`reel.shared.core.run.timers`): commit ``run_sleeping`` until the
                       earliest of their times; once woken, those due get new attempts.
``AwaitInput``         nothing of the turn can run or is running, and calls wait for a human
                       (their input requests are open, :mod:`reel.shared.core.input.requestevents`): commit
                       ``action.event(at_ms)`` (``run_awaiting_input``); the run rests.
=====================  ======================================================================

A call whose input request is open neither runs nor counts as running: the other calls
of its turn run to completion meanwhile. A rejected or answered call is terminal without
an attempt (its result is the answer: :func:`reel.shared.core.input.requestfold.observation`); an
approved one runs like any other, with the approved arguments.

Tool-call attempts of retry-safe tools left in flight by a dead executor are
superseded like any step's (a new attempt in ``DispatchCalls``); a failed call
with attempts left (``max_attempts`` of its tool, retryable error) is retried the
same way. At most ``max_parallel_tools`` calls of a turn run at once.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.agent.turnstate import TurnRecord
from reel.shared.core.input import requestfold
from reel.shared.core.run import timers
from reel.shared.core.run.events import AgentFinished, AgentStatus, BlobRef, RunAwaitingInput, StepDecl
from reel.shared.core.run.ids import AttemptNo, BranchId, RequestId, StepId
from reel.shared.core.run.state import STEP_TERMINAL, AttemptStatus, BranchState, RunState, StepStatus, attempts_status
from reel.shared.core.run.state import final_success as _final_success
from reel.shared.core.run.stepids import turn_step_id
from reel.shared.core.run.timers import Sleep

InFlight = Collection[tuple[BranchId, StepId, AttemptNo]]
DEFAULT_MAX_TURNS = 12
DEFAULT_MAX_PARALLEL = 4


class CallAttempt(msgspec.Struct, frozen=True):
    """Attempt ``attempt`` of the tool call ``step_id``."""

    step_id: StepId
    attempt: AttemptNo


class Wait(msgspec.Struct, frozen=True):
    """Every attempt that could start is already running in this executor: await one, then ask again."""


class DispatchTurn(msgspec.Struct, frozen=True, kw_only=True):
    """Start attempt ``attempt`` of turn ``turn`` (step ``step_id``) of agent step ``agent``.

    ``declare``: the turn is not declared yet; its intent commit declares it.
    """

    branch_id: BranchId
    agent: StepId
    step_id: StepId
    turn: int
    attempt: AttemptNo
    declare: bool


class DispatchCalls(msgspec.Struct, frozen=True, kw_only=True):
    """Start these tool-call attempts of agent ``agent`` concurrently (their intents in one commit)."""

    branch_id: BranchId
    agent: StepId
    calls: tuple[CallAttempt, ...]


class ResolveUnknown(msgspec.Struct, frozen=True, kw_only=True):
    """Record these orphaned attempts of non-retry-safe calls as ``outcome_unknown`` (never re-run)."""

    branch_id: BranchId
    agent: StepId
    calls: tuple[CallAttempt, ...]


class AdoptTurn(msgspec.Struct, frozen=True, kw_only=True):
    """Act on turn ``turn``'s recorded success (attempt ``attempt``, output ``output_ref``): declare its calls."""

    branch_id: BranchId
    agent: StepId
    step_id: StepId
    turn: int
    attempt: AttemptNo
    output_ref: BlobRef


class FinishAgent(msgspec.Struct, frozen=True, kw_only=True):
    """Commit the end of the loop (``agent_finished``) that the log does not record yet."""

    branch_id: BranchId
    agent: StepId
    status: AgentStatus
    turns: int
    error_kind: str | None = None
    message: str = ""
    output_ref: BlobRef | None = None

    def event(self, at_ms: int) -> AgentFinished:
        """The ``agent_finished`` event to commit (``at_ms``: epoch ms)."""
        return AgentFinished(branch_id=self.branch_id, step_id=self.agent, status=self.status, turns=self.turns,
                             error_kind=self.error_kind, message=self.message, output_ref=self.output_ref,
                             at_ms=at_ms)


class AwaitInput(msgspec.Struct, frozen=True, kw_only=True):
    """Only a human can move the agent ``agent`` on: commit ``run_awaiting_input`` (``requests``: the open ones)."""

    branch_id: BranchId
    agent: StepId
    requests: tuple[RequestId, ...]

    def event(self, at_ms: int) -> RunAwaitingInput:
        """The ``run_awaiting_input`` event to commit (``at_ms``: epoch ms)."""
        return RunAwaitingInput(branch_id=self.branch_id, at_ms=at_ms)


AgentAction = Wait | DispatchTurn | DispatchCalls | ResolveUnknown | AdoptTurn | FinishAgent | AwaitInput | Sleep


def limits(decl: StepDecl) -> tuple[int, int]:
    """``(max_turns, max_parallel_tools)`` of an agent step's declaration (defaults when unset)."""
    turns = decl.max_turns if isinstance(decl.max_turns, int) else DEFAULT_MAX_TURNS
    parallel = decl.max_parallel_tools if isinstance(decl.max_parallel_tools, int) else DEFAULT_MAX_PARALLEL
    return turns, parallel


def agent_action(state: RunState, branch_id: BranchId, decl: StepDecl, in_flight: InFlight = ()) -> AgentAction:
    """The next thing to do in the (not yet finished) agent step ``decl`` on ``branch_id``.

    O(calls of the latest turn): nothing here looks at earlier turns.
    """
    branch = state.branches[branch_id]
    rec = turnfold.record(branch, decl.step_id)
    if rec is None or not rec.turns:
        return DispatchTurn(branch_id=branch_id, agent=decl.step_id, step_id=turn_step_id(decl.step_id, 1), turn=1,
                            attempt=AttemptNo(1), declare=True)
    last = rec.turns[-1]
    if last.calls:
        return _calls_action(branch, branch_id, decl, last, in_flight)
    return _turn_action(branch, branch_id, decl.step_id, last, in_flight)


def _turn_action(branch: BranchState, bid: BranchId, agent: StepId, turn: TurnRecord,
                 in_flight: InFlight) -> AgentAction:
    sid, t = turn.decl.step_id, turn.decl.turn
    attempts = branch.attempts.get(sid, ())
    if not attempts:
        return DispatchTurn(branch_id=bid, agent=agent, step_id=sid, turn=t, attempt=AttemptNo(1), declare=False)
    last = attempts[-1]
    if last.status == AttemptStatus.DISPATCHED and (bid, sid, last.attempt) in in_flight:
        return Wait()
    status = attempts_status(attempts, turn.decl.max_attempts)
    if status == StepStatus.SUCCEEDED:
        win = _final_success(attempts)
        assert win is not None and win.output_ref is not None
        return AdoptTurn(branch_id=bid, agent=agent, step_id=sid, turn=t, attempt=win.attempt,
                         output_ref=win.output_ref)
    if status == StepStatus.FAILED:
        return FinishAgent(branch_id=bid, agent=agent, status="failed", turns=t, error_kind="turn_failed",
                           message=f"turn {t} failed: {last.error_kind}: {last.error_message}")
    return DispatchTurn(branch_id=bid, agent=agent, step_id=sid, turn=t, attempt=AttemptNo(last.attempt + 1),
                        declare=False)


def _calls_action(branch: BranchState, bid: BranchId, decl: StepDecl, turn: TurnRecord,
                  in_flight: InFlight) -> AgentAction:
    agent, t = decl.step_id, turn.decl.turn
    max_turns, max_parallel = limits(decl)
    start: list[CallAttempt] = []
    unknown: list[CallAttempt] = []
    asked: list[RequestId] = []
    waking: list[tuple[int, StepId]] = []  # calls that asked to be run again later: (the time, the call)
    running = 0
    for c in turn.calls:
        sid = c.decl.step_id
        gate = requestfold.gate(branch, sid)
        if gate != "none" and gate != "approved":
            rec = requestfold.request_of(branch, sid)
            if gate == "open" and rec is not None:
                asked.append(rec.request_id)
            continue                                                          # waiting, or ended by its answer
        attempts = branch.attempts.get(sid, ())
        status = attempts_status(attempts, c.decl.max_attempts)
        if status == StepStatus.FAILED and c.decl.fatal:
            last_failed = attempts[-1]
            return FinishAgent(branch_id=bid, agent=agent, status="failed", turns=t, error_kind="fatal_tool",
                               message=f"fatal tool {c.decl.tool_name} failed ({sid}): {last_failed.error_kind}: "
                                       f"{last_failed.error_message}")
        if status in STEP_TERMINAL:
            continue
        if not attempts:
            start.append(CallAttempt(sid, AttemptNo(1)))
            continue
        last = attempts[-1]
        if timers.waits(last) and not timers.resumable(branch, last):
            waking.append((timers.resume_at(last), sid))                      # asked to be run again later
        elif last.status != AttemptStatus.DISPATCHED:
            start.append(CallAttempt(sid, AttemptNo(last.attempt + 1)))       # retrying
        elif (bid, sid, last.attempt) in in_flight:
            running += 1
        elif c.decl.retry_safe:
            start.append(CallAttempt(sid, AttemptNo(last.attempt + 1)))       # supersede the orphan
        else:
            unknown.append(CallAttempt(sid, last.attempt))
    if unknown:
        return ResolveUnknown(branch_id=bid, agent=agent, calls=tuple(unknown))
    if not start and not running and waking:                                  # (a human's answer can wait)
        at, sid = min(waking)
        return Sleep(bid, sid, "resume_after", at)
    if not start and not running and asked:
        return AwaitInput(branch_id=bid, agent=agent, requests=tuple(asked))
    if not start and not running:                                             # every call is terminal
        if t >= max_turns:
            return FinishAgent(branch_id=bid, agent=agent, status="failed", turns=t, error_kind="max_turns",
                               message=f"{t} turns (max_turns) without a final answer")
        return DispatchTurn(branch_id=bid, agent=agent, step_id=turn_step_id(agent, t + 1), turn=t + 1,
                            attempt=AttemptNo(1), declare=True)
    room = max_parallel - running
    if start and room > 0:
        return DispatchCalls(branch_id=bid, agent=agent, calls=tuple(start[:room]))
    return Wait()
