"""The human-input part of the fold, and what planning, views and contexts read of it.

:mod:`reel.shared.core.run.fold` keeps one :class:`~reel.shared.core.input.requeststate.InputRecord` per tool
call that asked for input, in ``BranchState.requests`` (keyed by the call's step id, in
request order; absent from the encoding of a branch without requests, so older logs fold
to exactly what they did). The fold cases here are pure: each takes the branch's state
and returns the next one.

A call's **gate** (:func:`gate`) says what its request lets it do:

==========  ===========================================================================
``none``    no request: the call runs like any other
``open``    waiting for an answer: not runnable, not terminal (step status ``awaiting_input``)
``approved``  runs (with the approved arguments, :func:`effective_decl`)
``rejected``  terminal, never run: the model sees the note as an error result
``answered``  terminal, never run: the answer is the call's result (``ask_user``)
``closed``  the run was cancelled while it was open
==========  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.agent.turnstate import AgentRecord
from reel.shared.core.errors import InvalidTransition
from reel.shared.core.input.requestevents import InputAnswered, InputRequested, RunAwaitingInput
from reel.shared.core.input.requeststate import InputRecord, InputResponse
from reel.shared.core.run.events import DeclaredStep
from reel.shared.core.run.ids import LSN, RunId, StepId
from reel.shared.core.run.persistent import FrozenMap
from reel.shared.core.run.state import DRIVABLE, LIVE, BranchState, RunState, RunStatus
from reel.shared.core.run.stepids import order_key, parse_step_id

Gate = Literal["none", "open", "approved", "rejected", "answered", "closed"]
GATE_TERMINAL: frozenset[Gate] = frozenset({"rejected", "answered", "closed"})
"""Gates that end a call without running it."""

_NONE: FrozenMap[StepId, InputRecord] = FrozenMap()


def requests_of(branch: BranchState) -> Mapping[StepId, InputRecord]:
    """The branch's input requests by call step id, in request order (empty when it has none)."""
    return _NONE if branch.requests is msgspec.UNSET else branch.requests


def request_of(branch: BranchState, step_id: StepId) -> InputRecord | None:
    """The input request of the tool call ``step_id`` on ``branch`` (O(1)), if it asked for input."""
    return None if branch.requests is msgspec.UNSET else branch.requests.get(step_id)


def find(branch: BranchState, request_id: str) -> InputRecord | None:
    """The request with id ``request_id`` on ``branch`` (O(requests of the branch))."""
    return next((r for r in requests_of(branch).values() if r.request_id == request_id), None)


def open_requests(branch: BranchState) -> Iterator[InputRecord]:
    """The branch's requests still waiting for an answer, in request order."""
    return (r for r in requests_of(branch).values() if r.status == "open")


def open_calls(state: RunState) -> list[tuple[InputRecord, DeclaredStep | None]]:
    """The open requests of a live run's active branch, in request order, each with the call it asks about
    (its declaration: tool, arguments; ``None`` for a request of no declared call). Empty unless the run is
    live (``LIVE``). Pure."""
    if state.status not in LIVE:
        return []
    branch = state.active
    return [(r, turnfold.declared(branch, r.step_id)) for r in open_requests(branch)]


def gate(branch: BranchState, step_id: StepId) -> Gate:
    """What the call's request lets it do (see the module docstring)."""
    rec = request_of(branch, step_id)
    return "none" if rec is None or rec.kind == "elicitation" else rec.status  # an elicitation gates nothing


def effective_decl(branch: BranchState, decl: DeclaredStep) -> DeclaredStep:
    """The call as it runs: with the edited arguments of its approval, if any."""
    rec = request_of(branch, decl.step_id)
    if rec is None or rec.response is None or rec.response.arguments is None:
        return decl
    return msgspec.structs.replace(decl, arguments=rec.response.arguments, arguments_ref=None)


def observation(branch: BranchState, step_id: StepId) -> tuple[str, bool] | None:
    """The result the model sees of a call its request ended (``(text, is_error)``), else ``None``.

    A rejection reads ``error (rejected): …`` with the note; an answer is its text. A
    default committed at the deadline says so.
    """
    rec = request_of(branch, step_id)
    r = rec.response if rec is not None else None
    if rec is None or r is None or r.decision == "approve" or rec.kind == "elicitation":
        return None
    late = r.source == "deadline"
    if r.decision == "answer":
        return (f"(no answer before the deadline; the default answer) {r.text}" if late else r.text), False
    who = "nobody answered before the deadline; rejected by default" if late else \
        f"{r.by or 'the approver'} {'declined to answer' if rec.kind == 'question' else 'rejected this call'}"
    return f"error (rejected): {who}: {r.note or 'no reason given'}", True


def edited_prefix(branch: BranchState, step_id: StepId) -> str:
    """``"(approved with edited arguments: {…})\\n"`` when the call ran with edited arguments, else ``""``."""
    rec = request_of(branch, step_id)
    if rec is None or rec.response is None or rec.response.arguments is None:
        return ""
    return f"(approved with edited arguments: {rec.response.arguments})\n"


# ---- fold cases (pure: the branch's state in, the next one out) --------------------------------------
def apply(status: RunStatus, active_branch: str, branch: BranchState,
          event: InputRequested | InputAnswered | RunAwaitingInput, lsn: LSN, run_id: RunId, *,
          agent: Callable[[StepId], AgentRecord | None], attempts: Callable[[StepId], Sequence[object]]
          ) -> tuple[RunStatus, BranchState]:
    """The run's status and the branch's state after one human-input event on ``branch``.

    ``run_awaiting_input`` rests a driven run; ``input_answered`` wakes it (``running``) when
    the run was waiting on that branch. ``agent`` and ``attempts`` read the agent records and
    the attempts as folded so far (the fold's accumulator).

    Raises:
        InvalidTransition: see :func:`requested`, :func:`answered`; ``run_awaiting_input`` on a run not driven.
    """
    if isinstance(event, RunAwaitingInput):
        if status not in DRIVABLE:
            raise InvalidTransition(f"run_awaiting_input on a {status} run", run_id=run_id)
        return RunStatus.AWAITING_INPUT, branch
    if isinstance(event, InputRequested):
        parsed = parse_step_id(event.step_id)
        found = turnfold.entry_in(agent(parsed[0]), parsed) if parsed is not None else None
        return status, requested(branch, event, lsn, run_id, found.decl if found is not None else None,
                                 bool(attempts(event.step_id)))
    after = answered(branch, event, lsn, run_id)
    awake = status == RunStatus.AWAITING_INPUT and event.branch_id == active_branch
    return (RunStatus.RUNNING if awake else status), after


def requested(branch: BranchState, event: InputRequested, lsn: LSN, run_id: RunId, call: DeclaredStep | None,
              dispatched: bool) -> BranchState:
    """Fold case of ``input_requested``: ``call`` is the call's declaration on the branch (``None``: undeclared),
    ``dispatched`` whether it has an attempt. An ``elicitation`` is of a dispatched call and replaces the call's
    earlier (answered or closed) elicitation.

    Raises:
        InvalidTransition: not a declared tool call, one already dispatched, or a second request for it (an
            elicitation: a call not dispatched, or one with an open request or a request of another kind).
    """
    if call is None or call.kind != "tool_call":
        raise InvalidTransition(f"input_requested for {event.step_id!r}, which is not a declared tool call",
                                run_id=run_id)
    held = request_of(branch, event.step_id)
    if event.kind == "elicitation":  # asked by the server of a running call; the call's last one is kept
        if not dispatched or (held is not None and (held.kind != "elicitation" or held.status == "open")):
            raise InvalidTransition(f"elicitation for {event.step_id!r}, which "
                                    f"{'has an open request' if dispatched else 'has not run'}", run_id=run_id)
    elif dispatched or held is not None:
        raise InvalidTransition(f"input_requested for {event.step_id!r}, which already "
                                f"{'ran' if dispatched else 'has a request'}", run_id=run_id)
    rec = InputRecord(request_id=event.request_id, step_id=event.step_id, kind=event.kind, tool_name=event.tool_name,
                      call_id=event.call_id, asked=event.asked, question=event.question,
                      deadline_ms=event.deadline_ms, default=event.default, default_note=event.default_note,
                      lsn=lsn, at_ms=event.at_ms)
    known = branch.requests if branch.requests is not msgspec.UNSET else _NONE
    return msgspec.structs.replace(branch, requests=known.set(event.step_id, rec))


def answered(branch: BranchState, event: InputAnswered, lsn: LSN, run_id: RunId) -> BranchState:
    """Fold case of ``input_answered``.

    Raises:
        InvalidTransition: no such open request of that call on the branch.
    """
    rec = request_of(branch, event.step_id)
    if rec is None or rec.request_id != event.request_id or rec.status != "open":
        what = "not a request of that call" if rec is None or rec.request_id != event.request_id else rec.status
        raise InvalidTransition(f"input_answered for request {event.request_id!r} of {event.step_id!r}, which is "
                                f"{what}", run_id=run_id)
    response = InputResponse(decision=event.decision, arguments=event.arguments, note=event.note, text=event.text,
                             source=event.source, by=event.by, lsn=lsn, at_ms=event.at_ms)
    assert branch.requests is not msgspec.UNSET
    return msgspec.structs.replace(branch, requests=branch.requests.set(event.step_id, msgspec.structs.replace(
        rec, response=response)))


def close_open(branch: BranchState, lsn: LSN) -> BranchState:
    """Fold case of ``run_cancelled`` on the active branch: every open request closed at ``lsn`` (unchanged
    when none is open)."""
    closing = {sid: msgspec.structs.replace(r, closed_lsn=lsn) for sid, r in requests_of(branch).items()
               if r.status == "open"}
    if not closing:
        return branch
    assert branch.requests is not msgspec.UNSET
    return msgspec.structs.replace(branch, requests=branch.requests.merged(closing))


def inherit(parent: BranchState, positions: Mapping[StepId, int], fork_lsn: LSN,
            cutoff: tuple[int, int, int]) -> FrozenMap[StepId, InputRecord] | msgspec.UnsetType:
    """The parent's requests a fork keeps: of calls ordered before ``cutoff``, requested at or below ``fork_lsn``;
    an answer (or a close) committed after ``fork_lsn`` is not kept: the request is open again."""
    out: dict[StepId, InputRecord] = {}
    for sid, r in requests_of(parent).items():
        if r.lsn > fork_lsn or order_key(positions, sid) >= cutoff:
            continue
        if r.response is not None and r.response.lsn > fork_lsn:
            r = msgspec.structs.replace(r, response=None)
        if r.closed_lsn is not None and r.closed_lsn > fork_lsn:
            r = msgspec.structs.replace(r, closed_lsn=None)
        out[sid] = r
    return FrozenMap.of(out) if out else msgspec.UNSET

