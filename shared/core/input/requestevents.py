"""Events of human input, a resting state like Verifying: a request, its answer, the run waiting.

A tool call that needs approval (the tool's ``needs_approval``, or the workflow's
``approval`` policy by tool name) and every call of the built-in ``ask_user`` tool get
an :class:`InputRequested` in the commit that declares the call (the turn's answer),
instead of an intent. The call runs only once an :class:`InputAnswered` approves it
(with the model's arguments, or edited ones); a rejection and an answer are the call's
result for the model (an ``is_error`` observation with the note, the answer text).
An MCP server that elicits during a call gets an :class:`InputRequested` of kind ``elicitation`` for that
running call, committed by the executor that holds the call open; its answer is the server's, not the model's
(it does not gate the call). When nothing else of the run can run, the executor commits :class:`RunAwaitingInput`
and the run rests (status ``awaiting_input``) until an answer makes something runnable.

Writers: the executor (requests, ``run_awaiting_input``), the respond command's
mutator (``input_answered``, source ``respond``), recovery's sweep when a request's
deadline passes (``input_answered`` with the request's declared default, source
``deadline``). A ``run_cancelled`` closes every open request of the active branch
(:mod:`reel.shared.core.input.requestfold`). Times are fields (epoch ms): the fold reads no clock.
"""

from __future__ import annotations

from typing import Literal

from reel.shared.core.run.eventbase import Event
from reel.shared.core.run.ids import BranchId, RequestId, StepId

RequestKind = Literal["approval", "question", "elicitation"]
"""``approval``: may this tool call run? ``question``: the model's ``ask_user`` question. ``elicitation``: an MCP
server asks the user during a call that runs (its answer goes back to the server, not to the model)."""
Decision = Literal["approve", "reject", "answer"]
"""An approval is approved or rejected; a question is answered or rejected."""
AnswerSource = Literal["respond", "deadline"]
DECISIONS: dict[str, tuple[Decision, ...]] = {"approval": ("approve", "reject"), "question": ("answer", "reject"),
                                              "elicitation": ("answer", "reject")}
"""The decisions each kind of request takes."""


class InputRequested(Event, tag="input_requested", kw_only=True, frozen=True, omit_defaults=True):
    """Tool call ``step_id`` (declared in the same commit) waits for a human before it runs, or for its answer.

    Attributes:
        request_id: unique within the run (:func:`reel.shared.core.run.ids.request_id_for`).
        kind: ``approval`` or ``question``.
        tool_name, call_id: the call (its arguments are in its declaration).
        asked: who or what is asked (the tool's or the policy's ``ask``; free text).
        question: a question's text (the ``question`` argument of ``ask_user``).
        deadline_ms: when the request's ``default`` is committed unless answered (epoch ms; unset: never).
        default: the decision committed at the deadline; default_note: its note (a reject) or text (an answer).
    """

    branch_id: BranchId
    request_id: RequestId
    step_id: StepId
    kind: RequestKind
    tool_name: str
    call_id: str = ""
    asked: str = ""
    question: str = ""
    deadline_ms: int | None = None
    default: Decision | None = None
    default_note: str = ""
    at_ms: int


class InputAnswered(Event, tag="input_answered", kw_only=True, frozen=True, omit_defaults=True):
    """The answer to request ``request_id`` (of tool call ``step_id``): the call may now run, or has its result.

    Attributes:
        decision: ``approve`` (the call runs), ``reject`` (the model sees the note as an error result) or
            ``answer`` (a question's answer is the call's result).
        arguments: an approval with edited arguments: the JSON object the tool runs with (validated
            against the tool's ``parameters`` before it was committed); unset: the model's.
        note: a rejection's note; text: an answer's text.
        source: ``respond`` (a command) or ``deadline`` (recovery committed the request's default).
        by: who answered (free text from the command; empty if not given).
    """

    branch_id: BranchId
    request_id: RequestId
    step_id: StepId
    decision: Decision
    arguments: str | None = None
    note: str = ""
    text: str = ""
    source: AnswerSource = "respond"
    by: str = ""
    at_ms: int


class RunAwaitingInput(Event, tag="run_awaiting_input", kw_only=True, frozen=True):
    """Nothing of ``branch_id`` can run until a request is answered: the run rests in ``awaiting_input``."""

    branch_id: BranchId
    at_ms: int
