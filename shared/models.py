"""Model adapters: the port a model step calls (brief §1; real endpoints implement it later).

An adapter turns a :class:`ModelRequest` (the packed prompt text and ids) into a
:class:`ModelResponse` or raises :class:`~shared.core.errors.ModelError` (whose
``kind`` and ``retryable`` decide whether the step retries). Adapters must not
read the clock for anything that is committed; the executor measures latency.

Shipped adapters:

* ``replay`` — plays the recorded output of a real trajectory (``ModelSpec.output``).
* ``scripted`` — plays ``ModelSpec.outputs[attempt-1]`` (last one repeats); an entry
  ``{error, message}`` makes that attempt fail. For tests and demos.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import msgspec

from shared.core.errors import ModelError
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.core.workflow import ModelSpec, ScriptedFailure


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a model step sends: ids for logs, the prompt text, the attempt (1-based)."""

    run_id: str
    step_id: str
    attempt: int
    prompt: str
    prompt_tokens: int


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A model's answer: text, token counts and cost (USD)."""

    text: str
    input_tokens: int
    output_tokens: int
    cost_usd: float = 0.0
    model: str = ""


class ModelAdapter(Protocol):
    """Port implemented by every model backend."""

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Produce the model's output for ``request``.

        Raises:
            ModelError: the call failed; ``kind``/``retryable`` say how.
        """
        ...


class ReplayAdapter:
    """Plays a recorded output; reports recorded usage when the recording has it."""

    name = "replay"

    def __init__(self, spec: ModelSpec, counter: TokenCounter = DEFAULT_COUNTER) -> None:
        if spec.output is None:
            raise ValueError("replay adapter needs a recorded output")
        self._spec, self._output, self._counter = spec, spec.output, counter

    async def complete(self, request: ModelRequest) -> ModelResponse:
        usage = self._spec.usage
        in_tokens = usage.input_tokens if usage and usage.input_tokens is not None else request.prompt_tokens
        out_tokens = usage.output_tokens if usage and usage.output_tokens is not None else self._counter.count(
            self._output
        )
        return ModelResponse(
            text=self._output, input_tokens=in_tokens, output_tokens=out_tokens,
            cost_usd=usage.cost_usd if usage else 0.0, model=self._spec.name or "replay",
        )


class ScriptedAdapter:
    """Plays ``outputs[attempt-1]``; a :class:`ScriptedFailure` entry raises :class:`ModelError`."""

    name = "scripted"

    def __init__(self, spec: ModelSpec, counter: TokenCounter = DEFAULT_COUNTER) -> None:
        if not spec.outputs:
            raise ValueError("scripted adapter needs outputs")
        self._spec, self._counter = spec, counter

    async def complete(self, request: ModelRequest) -> ModelResponse:
        outputs = self._spec.outputs
        entry = outputs[min(request.attempt, len(outputs)) - 1]
        if isinstance(entry, ScriptedFailure):
            raise ModelError(entry.message or entry.error, kind=entry.error, retryable=entry.retryable)
        return ModelResponse(
            text=entry, input_tokens=request.prompt_tokens, output_tokens=self._counter.count(entry),
            model=self._spec.name or "scripted",
        )


def make_adapter(spec: ModelSpec, counter: TokenCounter = DEFAULT_COUNTER) -> ModelAdapter:
    """The adapter a :class:`ModelSpec` names: ``replay``, ``scripted``, or ``module:factory``.

    A ``module:factory`` adapter is your own model endpoint: ``factory(spec, counter)``
    must return an object with ``name`` and ``async complete(ModelRequest) -> ModelResponse``
    that raises :class:`~shared.core.errors.ModelError` on failure.

    Raises:
        ModelError: a ``module:factory`` that cannot be imported (non-retryable, kind ``adapter_unavailable``).
        ValueError: unknown built-in adapter (workflow validation rejects these earlier).
    """
    if spec.adapter == "replay":
        return ReplayAdapter(spec, counter)
    if spec.adapter == "scripted":
        return ScriptedAdapter(spec, counter)
    if ":" in spec.adapter:
        module, _, name = spec.adapter.partition(":")
        try:
            factory = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ModelError(f"cannot load model adapter {spec.adapter!r}: {exc}", kind="adapter_unavailable",
                             retryable=False) from exc
        adapter: ModelAdapter = factory(spec, counter)
        return adapter
    raise ValueError(f"unknown model adapter {spec.adapter!r}")
