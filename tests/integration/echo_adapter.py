"""A user-supplied model adapter, loaded by import path (``adapter: tests.integration.echo_adapter:make``)."""

from __future__ import annotations

from reel.shared.core.chat.messages import ChatRequest, ChatResponse
from reel.shared.core.errors import ModelError
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.workflow.spec import ModelSpec


class EchoModel:
    """Answers with the last line of its last message; fails its first attempt as rate limited (billed 0.001 USD)."""

    name = "echo"

    def __init__(self, spec: ModelSpec, counter: TokenCounter) -> None:
        self.counter = counter

    async def complete_chat(self, request: ChatRequest) -> ChatResponse:
        if request.attempt == 1:
            raise ModelError("429 from the echo endpoint", kind="rate_limited", cost_usd=0.001)
        text = "echo: " + (request.messages[-1].content or "").strip().splitlines()[-1]
        tokens_in = request.prompt_tokens if request.prompt_tokens is not None else self.counter.count(
            " ".join(m.content or "" for m in request.messages))
        return ChatResponse(text=text, input_tokens=tokens_in, output_tokens=self.counter.count(text),
                            cost_usd=0.002, model="echo-1", message={"role": "assistant", "content": text})


def make(spec: ModelSpec, counter: TokenCounter) -> EchoModel:
    return EchoModel(spec, counter)


class BuggyModel:
    """An adapter with a bug: every call raises ``KeyError`` (not a ModelError)."""

    name = "buggy"

    async def complete_chat(self, request: ChatRequest) -> ChatResponse:
        raise KeyError("choices")


def buggy(spec: ModelSpec, counter: TokenCounter) -> BuggyModel:
    return BuggyModel()
