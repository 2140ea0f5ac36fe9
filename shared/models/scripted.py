"""The ``scripted`` adapter: plays answers written in the workflow (tests, demos, the shipped example).

Two shapes (docs/models.md):

* ``outputs`` — per attempt: attempt *a* plays ``outputs[a-1]`` (the last repeats); a
  ``{error, message, retryable}`` entry fails that attempt. Text only (a ``kind: model`` step).
* ``turns`` — per turn of an agent step: turn *t* plays ``turns[t-1]`` (the last repeats):
  attempts 1…len(``failures``) fail with those, the next answers with ``text`` and
  ``tool_calls`` ``{name, arguments, id?}``.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from reel.shared.core.chat.messages import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ToolCall,
    assign_call_ids,
    flatten,
    wire_call,
)
from reel.shared.core.errors import ModelError
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER, TokenCounter
from reel.shared.core.workflow.modelspec import ModelSpec, ScriptedFailure, ScriptedTurn


def _fail(entry: ScriptedFailure) -> ModelError:
    return ModelError(entry.message or entry.error, kind=entry.error, retryable=entry.retryable)


def _taken_ids(request: ChatRequest) -> set[str]:
    return {c.id for m in request.messages for c in m.tool_calls}


def play_turn(spec: ModelSpec, turn: ScriptedTurn, request: ChatRequest, counter: TokenCounter) -> ChatResponse:
    """The answer ``turn`` scripts for ``request`` (failures by attempt first).

    Tokens: ``turn.usage`` when recorded, else counted (the flattened transcript in; text
    and arguments out); cost from the spec's price unless usage recorded one. ``usage_source``:
    ``recorded`` when both counts come from ``turn.usage``, else ``estimated`` (in: the request's
    ``prompt_tokens`` when it has them). The finish reason is
    the turn's ``finish_reason`` when scripted (to play a cut answer), else ``tool_calls``/``stop``.

    Raises:
        ModelError: the attempt is one of the turn's scripted failures.
    """
    if request.attempt <= len(turn.failures):
        raise _fail(turn.failures[request.attempt - 1])
    sent = tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments if isinstance(c.arguments, str)
                          else msgspec.json.encode(c.arguments).decode()) for c in turn.tool_calls)
    message: dict[str, object] = {"role": "assistant", "content": turn.text or None}
    if sent:
        message["tool_calls"] = [wire_call(c) for c in sent]
    u = turn.usage
    tokens_in = u.input_tokens if u and u.input_tokens is not None else request.prompt_tokens \
        if request.prompt_tokens is not None else _transcript_tokens(request.messages, counter)
    tokens_out = u.output_tokens if u and u.output_tokens is not None else counter.count(
        " ".join([turn.text, *(c.arguments for c in sent)]))
    recorded = u is not None and u.input_tokens is not None and u.output_tokens is not None
    return ChatResponse(
        text=turn.text, tool_calls=assign_call_ids(sent, turn=request.turn, taken=_taken_ids(request)),
        finish_reason=_finish(turn, sent), input_tokens=tokens_in, output_tokens=tokens_out,
        cost_usd=u.cost_usd if u and u.cost_usd else spec.cost_usd(tokens_in, tokens_out),
        model=spec.model_name, message=message, usage_source="recorded" if recorded else "estimated",
    )


def _finish(turn: ScriptedTurn, sent: Sequence[ToolCall]) -> str | None:
    """The turn's scripted ``finish_reason`` when it sets one (``None`` included), else ``tool_calls``/``stop``."""
    if not isinstance(turn.finish_reason, msgspec.UnsetType):
        return turn.finish_reason
    return "tool_calls" if sent else "stop"


_COUNTED: dict[tuple[str, ChatMessage], int] = {}  # (counter, message) → tokens of its flattened text


def _transcript_tokens(messages: Sequence[ChatMessage], counter: TokenCounter) -> int:
    """``counter.count(flatten(messages))``, summed per message and memoized: a transcript's messages are
    joined by blank lines, which no token spans, so the sum is the same count — but a turn re-counts only
    its new messages, not the whole transcript (bounded memo)."""
    total = 0
    for m in messages:
        key = (getattr(counter, "name", type(counter).__name__), m)
        n = _COUNTED.get(key)
        if n is None:
            if len(_COUNTED) > 100_000:
                _COUNTED.clear()
            n = _COUNTED[key] = counter.count(flatten((m,)))
        total += n
    return total


def scripted_turn(spec: ModelSpec, turn: int) -> ScriptedTurn:
    """``turns[turn-1]``, the last one repeating. Raises IndexError when ``turns`` is empty."""
    turns = spec.scripted_turns
    return turns[min(turn, len(turns)) - 1]


class ScriptedAdapter:
    """Plays ``turns[turn-1]``, else ``outputs[attempt-1]``."""

    name = "scripted"

    def __init__(self, spec: ModelSpec, counter: TokenCounter = DEFAULT_COUNTER) -> None:
        if not spec.outputs and not spec.scripted_turns:
            raise ValueError("scripted adapter needs outputs or turns")
        self._spec, self._counter = spec, counter

    async def complete_chat(self, request: ChatRequest) -> ChatResponse:
        """Turn *t* plays ``turns[t-1]``; without ``turns``, attempt *a* plays ``outputs[a-1]`` as text."""
        if self._spec.scripted_turns:
            return play_turn(self._spec, scripted_turn(self._spec, request.turn), request, self._counter)
        outputs = self._spec.outputs
        entry = outputs[min(request.attempt, len(outputs)) - 1]
        if isinstance(entry, ScriptedFailure):
            raise _fail(entry)
        return play_turn(self._spec, ScriptedTurn(text=entry), msgspec.structs.replace(request, attempt=1),
                         self._counter)
