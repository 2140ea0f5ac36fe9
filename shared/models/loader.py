"""Which adapter a :class:`~reel.shared.core.workflow.modelspec.ModelSpec` names: built-in, or ``module:factory``."""

from __future__ import annotations

import importlib
from typing import Any, cast

from reel.shared.core.errors import ModelError
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER, TokenCounter
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.models.base import ChatModel
from reel.shared.models.replay import ReplayAdapter
from reel.shared.models.scripted import ScriptedAdapter


def _load(spec: ModelSpec, counter: TokenCounter) -> Any:
    if spec.adapter == "replay":
        return ReplayAdapter(spec, counter)
    if spec.adapter == "scripted":
        return ScriptedAdapter(spec, counter)
    if spec.adapter == "openai":
        from reel.shared.models.openai import OpenAIAdapter  # imports the openai package (≈1 s) only when used

        return OpenAIAdapter(spec, counter)
    if ":" in spec.adapter:
        module, _, name = spec.adapter.partition(":")
        try:
            factory = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ModelError(f"cannot load model adapter {spec.adapter!r}: {exc}", kind="adapter_unavailable",
                             retryable=False) from exc
        return factory(spec, counter)
    raise ValueError(f"unknown model adapter {spec.adapter!r}")


def make_chat_model(spec: ModelSpec, counter: TokenCounter = DEFAULT_COUNTER) -> ChatModel:
    """The model a spec names: ``replay``, ``scripted``, ``openai``, or ``module:factory``.

    A ``module:factory`` adapter is your own model endpoint: ``factory(spec, counter)`` must return
    a :class:`~reel.shared.models.base.ChatModel` — an object with ``name`` and
    ``async complete_chat(ChatRequest) -> ChatResponse`` that raises
    :class:`~reel.shared.core.errors.ModelError` on failure.

    Raises:
        ModelError: a ``module:factory`` that cannot be imported, or whose object has no ``complete_chat``
            (non-retryable, kind ``adapter_unavailable``).
        ValueError: unknown built-in adapter (workflow validation rejects these earlier).
    """
    model = _load(spec, counter)
    if ":" in spec.adapter and not isinstance(model, ChatModel):  # a built-in adapter always is one
        raise ModelError(f"model adapter {spec.adapter!r} returned {type(model).__name__}, which has no "
                         "`name` and `async complete_chat(ChatRequest) -> ChatResponse` (the model port, "
                         "docs/models.md)", kind="adapter_unavailable", retryable=False)
    return cast(ChatModel, model)
