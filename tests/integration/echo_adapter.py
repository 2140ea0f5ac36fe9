"""A user-supplied model adapter, loaded by import path (``adapter: tests.integration.echo_adapter:make``)."""

from __future__ import annotations

from reel.shared.core.errors import ModelError
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.workflow.spec import ModelSpec
from reel.shared.models import ModelRequest, ModelResponse


class EchoModel:
    """Answers with the last line of its prompt; fails its first attempt as rate limited (billed 0.001 USD)."""

    name = "echo"

    def __init__(self, spec: ModelSpec, counter: TokenCounter) -> None:
        self.counter = counter

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if request.attempt == 1:
            raise ModelError("429 from the echo endpoint", kind="rate_limited", cost_usd=0.001)
        text = "echo: " + request.prompt.strip().splitlines()[-1]
        return ModelResponse(text=text, input_tokens=request.prompt_tokens, output_tokens=self.counter.count(text),
                             cost_usd=0.002, model="echo-1")


def make(spec: ModelSpec, counter: TokenCounter) -> EchoModel:
    return EchoModel(spec, counter)
