"""The records the fold keeps of human input (``BranchState.requests``; :mod:`reel.shared.core.input.requestfold`).

Frozen, like the rest of the folded state (:mod:`reel.shared.core.run.state`). One
:class:`InputRecord` per tool call that asked for input, keyed by the call's step id;
views and verifiers read the same records (a verifier can judge "did the agent ask
before deleting" from a call's request and its answer).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from reel.shared.core.input.requestevents import AnswerSource, Decision, RequestKind
from reel.shared.core.run.ids import LSN, RequestId, StepId

RequestStatus = Literal["open", "approved", "rejected", "answered", "closed"]
_ANSWERED: dict[Decision, RequestStatus] = {"approve": "approved", "reject": "rejected", "answer": "answered"}


class InputResponse(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How a request was answered (:class:`~reel.shared.core.input.requestevents.InputAnswered`, committed at
        ``lsn``)."""

    decision: Decision
    arguments: str | None = None
    note: str = ""
    text: str = ""
    source: AnswerSource = "respond"
    by: str = ""
    lsn: LSN
    at_ms: int


class InputRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One input request (:class:`~reel.shared.core.input.requestevents.InputRequested`, committed at ``lsn``) and its
    answer.

    Attributes:
        response: the answer, once committed.
        closed_lsn: the ``run_cancelled`` that closed it unanswered.
    """

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
    lsn: LSN
    at_ms: int
    response: InputResponse | None = None
    closed_lsn: LSN | None = None

    @property
    def status(self) -> RequestStatus:
        """``open``, ``closed`` (cancelled unanswered), or ``approved``/``rejected``/``answered``."""
        if self.response is not None:
            return _ANSWERED[self.response.decision]
        return "open" if self.closed_lsn is None else "closed"
