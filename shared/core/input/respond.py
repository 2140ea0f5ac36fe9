"""Respond's pure core: what a :class:`~reel.shared.core.wire.commands.RespondRun` commits, and what a deadline does.

The respond command answers one input request (:mod:`reel.shared.core.input.requestevents`) of the
run's active branch. :func:`decide` gives the ``input_answered`` to commit, a
:class:`~reel.shared.core.decision.Skip` (nothing to write, the reason), or raises a refusal:

================================================  ==================================================
case                                              answer
================================================  ==================================================
an open request, a decision its kind takes        ``input_answered`` (source ``respond``)
the same answer again (a retry, a redelivery)     NoOp: duplicate
already answered by its deadline's default        NoOp: late
the run ended or was cancelled, the request is    NoOp: late
closed, its agent step finished, or it is on a
branch a rewind left
already answered otherwise                        :class:`RequestAnswered` (``request_answered``)
no such request in the run                        :class:`RequestNotFound` (``request_not_found``)
a decision the kind does not take; edited         ``invalid_command``, naming the field
arguments that fail the tool's ``parameters``
================================================  ==================================================

Deadlines are fired from outside the fold, by a clock: recovery's sweep asks
:func:`deadline_events` with the time it read (:func:`due` says which runs to look at).
Fenced on the head, a default fires once: a request answered meanwhile is no longer due.
No clock, I/O or randomness here.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.decision import Decision, Skip, events_or_skip
from reel.shared.core.errors import InvalidCommand
from reel.shared.core.input import requestfold
from reel.shared.core.input.requestevents import DECISIONS, InputAnswered
from reel.shared.core.input.requesting import argument_error
from reel.shared.core.input.requeststate import InputRecord, InputResponse
from reel.shared.core.run.state import LIVE, BranchState, RunState
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.wire.commands import RespondRun
from reel.shared.core.workflow.spec import WorkflowSpec

MAX_ARGUMENTS_BYTES = 64 * 1024
"""Edited arguments are carried inline in the answer: at most this many bytes of JSON."""


class RequestNotFound(InvalidCommand):
    """The run has no input request with that id."""

    code = "request_not_found"


class RequestAnswered(InvalidCommand):
    """The request was answered already, otherwise."""

    code = "request_answered"


def _over(state: RunState, rec: InputRecord) -> str | None:
    """Why an answer to ``rec`` (on the active branch) is too late, or ``None``."""
    if state.status not in LIVE or rec.status == "closed":
        return f"the run is {state.status}: request {rec.request_id} is closed"
    parsed = parse_step_id(rec.step_id)
    agent = turnfold.record(state.active, parsed[0]) if parsed else None
    if agent is not None and agent.finished is not None:
        return f"agent step {agent.step_id} has finished: request {rec.request_id} is moot"
    return None


def answer_of(state: RunState, cmd: RespondRun, spec: WorkflowSpec, rec: InputRecord, *, at_ms: int) -> InputAnswered:
    """The ``input_answered`` of ``cmd`` for ``rec`` (``spec``: the run's workflow, for the tool's parameters).

    Raises:
        InvalidCommand: a decision the request's kind does not take, a field that does not go with the
            decision, edited arguments that fail the tool's ``parameters`` (naming the field).
    """
    takes = DECISIONS[rec.kind]
    if cmd.decision not in takes:
        raise InvalidCommand(f"request {rec.request_id} is {'an approval' if rec.kind == 'approval' else 'a question'}"
                             f": it takes {' or '.join(takes)}, not {cmd.decision!r} (at `$.decision`)")
    stray = [f for f, v, d in (("arguments", cmd.arguments is not None, "approve"), ("note", bool(cmd.note), "reject"),
                               ("text", bool(cmd.text), "answer")) if v and cmd.decision != d]
    if stray:
        raise InvalidCommand(f"{cmd.decision} takes no `{stray[0]}` (at `$.{stray[0]}`)")
    if cmd.decision == "answer" and not cmd.text.strip():
        raise InvalidCommand("answer needs a non-empty `text` (at `$.text`)")
    arguments = None
    if cmd.arguments is not None:
        parsed = parse_step_id(rec.step_id)
        tool = next((t for t in spec.agent(parsed[0]).tools if t.name == rec.tool_name), None) if parsed else None
        error = argument_error(tool.schema, cmd.arguments, "$.arguments") if tool is not None else \
            f"the workflow has no tool {rec.tool_name!r} (at `$.arguments`)"
        if error is not None:
            raise InvalidCommand(f"edited arguments for {rec.tool_name}: {error}")
        arguments = msgspec.json.encode(cmd.arguments).decode()
        if len(arguments) > MAX_ARGUMENTS_BYTES:
            raise InvalidCommand(f"edited arguments are {len(arguments)} bytes, over {MAX_ARGUMENTS_BYTES}"
                                 " (at `$.arguments`)")
    return InputAnswered(branch_id=state.active_branch, request_id=rec.request_id, step_id=rec.step_id,
                         decision=cmd.decision, arguments=arguments, note=cmd.note, text=cmd.text, by=cmd.by,
                         at_ms=at_ms)


def _same(recorded: InputResponse, new: InputAnswered) -> bool:
    return (recorded.decision, recorded.arguments, recorded.note, recorded.text) == (
        new.decision, new.arguments, new.note, new.text)


def decide(state: RunState, cmd: RespondRun, spec: WorkflowSpec, *, at_ms: int) -> Decision:
    """Pure: ``(input_answered,)`` that ``cmd`` commits on ``state`` (at ``at_ms``, epoch ms), or ``Skip`` (why not).

    Raises:
        RequestNotFound, RequestAnswered, InvalidCommand: see the module docstring.
    """
    active = state.active
    rec = requestfold.find(active, cmd.request_id)
    if rec is None:
        left = next((b.branch_id for b in state.branches.values() if requestfold.find(b, cmd.request_id)), None)
        if left is None:
            waiting = ", ".join(r.request_id for r in requestfold.open_requests(active)) or "none"
            raise RequestNotFound(f"run {state.run_id} has no input request {cmd.request_id!r} (open: {waiting})",
                                  run_id=state.run_id)
        return Skip(f"request {cmd.request_id} is on branch {left}, which a rewind left (the run goes on on"
                    f" {state.active_branch})")
    done = rec.response
    if done is None:
        late = _over(state, rec)
        return Skip(late) if late is not None else (answer_of(state, cmd, spec, rec, at_ms=at_ms),)
    answer = answer_of(state, cmd, spec, rec, at_ms=at_ms)
    if _same(done, answer):
        return Skip(f"duplicate: request {rec.request_id} was answered {done.decision} the same way at lsn"
                    f" {done.lsn}")
    if done.source == "deadline":
        return Skip(f"late: request {rec.request_id}'s deadline passed; its default ({done.decision}) was"
                    f" committed at lsn {done.lsn}")
    raise RequestAnswered(f"request {rec.request_id} was already answered: {done.decision}"
                          f"{' by ' + done.by if done.by else ''} at lsn {done.lsn}", run_id=state.run_id)


# ---- deadlines (fired by recovery's sweep, with the time it read) -----------------------------------------------
def due(state: RunState, now_ms: int) -> Iterator[InputRecord]:
    """The open requests of the run's active branch whose deadline is at or before ``now_ms``."""
    if state.status not in LIVE:
        return iter(())
    return (r for r in requestfold.open_requests(state.active)
            if r.deadline_ms is not None and r.deadline_ms <= now_ms and _over(state, r) is None)


def earliest_deadline(branch: BranchState) -> int | None:
    """The earliest deadline of an open request of ``branch`` (epoch ms), if any (a live run's active branch is
    the one whose deadlines fire: :func:`reel.shared.core.run.timers.next_due`)."""
    return min((r.deadline_ms for r in requestfold.open_requests(branch) if r.deadline_ms is not None), default=None)


def deadline_events(state: RunState, now_ms: int) -> Decision:
    """The default answer of every request :func:`due` at ``now_ms`` (source ``deadline``; one commit), or
    ``Skip("no deadline due")``."""
    out = []
    for r in due(state, now_ms):
        decision = r.default or "reject"
        out.append(InputAnswered(branch_id=state.active_branch, request_id=r.request_id, step_id=r.step_id,
                                 decision=decision, note=r.default_note if decision == "reject" else "",
                                 text=r.default_note if decision == "answer" else "", source="deadline",
                                 at_ms=now_ms))
    return events_or_skip(out, "no deadline due")
