"""The model port: what a model step (``ModelAdapter``) and an agent turn (``ChatModel``) call.

Two protocols (docs/models.md):

* **v2, chat** — ``async complete_chat(ChatRequest) -> ChatResponse``: chat messages
  and tool schemas in; text, tool calls, finish reason and usage out. Every shipped
  adapter implements it.
* **v1, prompt** — ``async complete(ModelRequest) -> ModelResponse``: one packed prompt
  text in, text out. What ``kind: model`` steps call; adapters written for it keep
  working, and :class:`LegacyChat` lets one serve chat requests too (messages flattened
  to a prompt, never any tool call).

Both raise :class:`~reel.shared.core.errors.ModelError`, whose ``kind``, ``retryable`` and
``retry_after_s`` decide whether and when the attempt is retried.

**Streaming**: when the model spec sets ``stream: true`` (and only then) the executor calls
``complete_chat(request, on_delta=sink)`` / ``complete(request, on_delta=sink)``: the adapter
awaits ``sink(chunk)`` with each fragment (:class:`~reel.shared.core.wire.livemessages.StreamChunk`, ``seq`` is
renumbered by the sink) as it arrives and still returns the whole response. Adapters must not
read the clock for anything that is committed; the executor measures latency.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

import msgspec

from reel.shared.core.chat.messages import ChatRequest, ChatResponse, flatten
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER, TokenCounter
from reel.shared.core.run.eventfields import UsageSource
from reel.shared.core.wire.livemessages import StreamChunk

DeltaSink = Callable[[StreamChunk], Awaitable[None]]
"""Where a streaming adapter sends each fragment of a response (the executor publishes it on core NATS)."""


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a model step sends: ids for logs, the prompt text, the attempt (1-based)."""

    run_id: str
    step_id: str
    attempt: int
    prompt: str
    prompt_tokens: int


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A model's answer: text, token counts and cost (USD).

    Attributes:
        finish_reason: the server's, exactly as sent (``None``: it sent none, or the adapter does not say).
        usage_source: where the token counts come from (``reported`` by the server, ``estimated`` by
            Reel's counter, ``recorded`` in a recording); an adapter that does not say claims ``reported``.
    """

    text: str
    input_tokens: int
    output_tokens: int
    cost_usd: float = 0.0
    model: str = ""
    finish_reason: str | None = None
    usage_source: UsageSource = "reported"


class ModelAdapter(Protocol):
    """Port v1, implemented by every model backend a ``kind: model`` step can name."""

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Produce the model's output for ``request``.

        Raises:
            ModelError: the call failed; ``kind``/``retryable`` say how.
        """
        ...


@runtime_checkable
class ChatModel(Protocol):
    """Port v2: a chat model an agent turn calls."""

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


class LegacyChat:
    """Serves chat requests with a v1 adapter: the messages flattened to one prompt, the text returned.

    Tools offered are ignored (a v1 adapter cannot call them), so an agent step on such an
    adapter ends after its first turn.
    """

    def __init__(self, adapter: ModelAdapter, counter: TokenCounter = DEFAULT_COUNTER) -> None:
        self.adapter, self.counter, self.name = adapter, counter, adapter.name

    async def complete_chat(self, request: ChatRequest) -> ChatResponse:
        """One ``complete`` of the flattened messages; its text as a plain assistant message (no tool calls).

        Raises:
            ModelError: whatever the v1 adapter raised.
        """
        prompt = flatten(request.messages)
        resp = await self.adapter.complete(ModelRequest(
            run_id=request.run_id, step_id=request.step_id, attempt=request.attempt, prompt=prompt,
            prompt_tokens=self.counter.count(prompt)))
        return ChatResponse(text=resp.text, finish_reason=resp.finish_reason, input_tokens=resp.input_tokens,
                            output_tokens=resp.output_tokens, cost_usd=resp.cost_usd, model=resp.model,
                            message={"role": "assistant", "content": resp.text}, usage_source=resp.usage_source)


def as_chat_model(adapter: ModelAdapter | ChatModel, counter: TokenCounter = DEFAULT_COUNTER) -> ChatModel:
    """``adapter`` itself when it speaks port v2, else wrapped in :class:`LegacyChat`."""
    if isinstance(adapter, ChatModel):
        return adapter
    return LegacyChat(adapter, counter)
