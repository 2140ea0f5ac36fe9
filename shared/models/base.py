"""The model port: what a ``kind: model`` step and an agent turn call (docs/models.md).

One protocol, :class:`ChatModel` — ``async complete_chat(ChatRequest) -> ChatResponse``: chat
messages and tool schemas in; text, tool calls, finish reason and usage out. A ``kind: model``
step asks it as the first turn of an agent with no tools: its instructions the system message, its packed
context the user message (:func:`reel.shared.core.agent.turncontext.model_turn`). Every adapter, shipped or your own
``module:factory``, implements it and raises :class:`~reel.shared.core.errors.ModelError`, whose
``kind``, ``retryable`` and ``retry_after_s`` decide whether and when the attempt is retried.

**Streaming**: when the model spec sets ``stream: true`` (and only then) the executor calls
``complete_chat(request, on_delta=sink)``: the adapter awaits ``sink(chunk)`` with each fragment
(:class:`~reel.shared.core.wire.livemessages.StreamChunk`, ``seq`` is renumbered by the sink) as it
arrives and still returns the whole response. Adapters must not read the clock for anything that is
committed; the executor measures latency.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from reel.shared.core.chat.messages import ChatRequest, ChatResponse
from reel.shared.core.wire.livemessages import StreamChunk

DeltaSink = Callable[[StreamChunk], Awaitable[None]]
"""Where a streaming adapter sends each fragment of a response (the executor publishes it on core NATS)."""


@runtime_checkable
class ChatModel(Protocol):
    """The model port: one attempt of one turn (a ``kind: model`` step is one turn with no tools)."""

    name: str

    async def complete_chat(self, request: ChatRequest) -> ChatResponse:
        """Answer one attempt of one turn.

        The response's ``tool_calls`` have unique non-empty ids (provider ids kept, others
        assigned by :func:`reel.shared.core.chat.messages.assign_call_ids`); ``message`` is the response
        message as the provider sent it.

        Raises:
            ModelError: the attempt failed; ``kind``, ``retryable``, ``retry_after_s`` (s) say how.
        """
        ...
