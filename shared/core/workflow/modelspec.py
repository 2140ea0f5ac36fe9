"""Model specs: which adapter a model (or agent) step calls, and how (docs/models.md).

A :class:`ModelSpec` names an adapter — ``replay``, ``scripted``, ``openai`` or a
``module:factory`` of your own — and carries that adapter's settings. Fields added
for chat models (``base_url`` … ``turns``) default to ``UNSET`` and are then left
out of the encoded workflow, so workflows written before them encode (and hash)
exactly as they did.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.modelcompat import PROFILES, Compat, WireCompat, resolve

MODEL_ADAPTERS = ("replay", "scripted", "openai")
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Body keys Reel itself sets (or cannot honour) — a spec's ``params`` may not carry them.
RESERVED_PARAMS = ("model", "messages", "tools", "stream", "stream_options")
STREAMING_ADAPTERS = ("openai",)
"""Built-in adapters that can stream (``stream: true``); a ``module:factory`` one may too (docs/models.md)."""
DEFAULT_TIMEOUT_S = 120.0


class ScriptedFailure(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A scripted attempt that fails with ``error`` (kind) and ``message``."""

    error: str
    message: str = ""
    retryable: bool = True


ScriptedOutput = str | ScriptedFailure


class RecordedUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Usage recorded with a replayed output (tokens, USD)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float = 0.0


class Price(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a model's tokens cost, in USD per million tokens (the providers' price lists)."""

    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        """USD billed for one call of ``input_tokens`` in and ``output_tokens`` out (rounded to 1e-10)."""
        return round((input_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok) / 1e6, 10)


class ScriptedToolCall(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tool call a scripted model makes.

    Attributes:
        name: the tool called (need not be declared: scripts test undeclared calls too).
        arguments: a mapping (sent JSON-encoded) or a raw string (sent as is, e.g. broken JSON).
        id: the provider id to report; empty makes Reel assign one (``call_t<turn>_<i>``).
    """

    name: str
    arguments: dict[str, Any] | str = {}
    id: str = ""


class ScriptedTurn(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One turn of a scripted (or replayed) chat model.

    Attributes:
        text: the assistant text of the turn.
        tool_calls: the calls it makes; a turn without calls ends an agent loop.
        failures: attempts 1…len(failures) of this turn fail with these; the next attempt answers.
        usage: recorded usage to report instead of counted tokens (replay).
        finish_reason: the finish reason the answer reports (unset: ``tool_calls`` when it calls tools,
            else ``stop``); e.g. ``length`` plays an answer cut at ``max_tokens``.
    """

    text: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    failures: tuple[ScriptedFailure, ...] = ()
    usage: RecordedUsage | None = None
    finish_reason: str | msgspec.UnsetType | None = msgspec.UNSET


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which model adapter a model step calls.

    Attributes:
        adapter: ``replay`` (plays ``output``), ``scripted`` (plays ``outputs[attempt-1]``, or ``turns``),
            ``openai`` (an OpenAI-compatible chat-completions endpoint), or ``module:factory``.
        output: the recorded output (replay).
        outputs: per-attempt outputs or failures (scripted); the last one repeats.
        usage: recorded usage to report instead of counted tokens (replay).
        name: model name for logs, e.g. ``google/gemini-3-pro-preview``.
        base_url: endpoint of ``openai``, e.g. ``http://127.0.0.1:8000/v1``.
        model: model name sent to the endpoint (``openai``; others report it).
        api_key_env: NAME of the environment variable holding the API key (never the key itself);
            unset: a placeholder key, for local servers.
        params: extra request-body fields, e.g. ``{temperature: 0}``.
        timeout_s: deadline of one HTTP call (s); default 120.
        price: USD per million input/output tokens; unset: cost 0.
        turns: per-turn responses (scripted, replay); turn t plays ``turns[t-1]``, the last one repeats.
        stream: stream each call's response (``openai``, or an adapter of your own): its deltas go out on
            ``<ns>.stream.<run>.<branch>.<step>.<attempt>`` as they arrive; the log keeps the whole response.
        profile: the server's wire profile (:data:`~reel.shared.core.workflow.modelcompat.PROFILES`:
            ``openai``, ``vllm``, ``llama-server``, ``llama-cpp-python``, ``ollama``, ``litellm``); unset: the
            defaults every one of them accepts.
        compat: overrides of the profile's settings (:class:`~reel.shared.core.workflow.modelcompat.Compat`).
    """

    adapter: str
    output: str | None = None
    outputs: tuple[ScriptedOutput, ...] = ()
    usage: RecordedUsage | None = None
    name: str = ""
    base_url: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    api_key_env: str | UnsetType = UNSET
    params: dict[str, Any] | UnsetType = UNSET
    timeout_s: float | UnsetType = UNSET
    price: Price | UnsetType = UNSET
    turns: tuple[ScriptedTurn, ...] | UnsetType = UNSET
    stream: bool | UnsetType = UNSET
    profile: str | UnsetType = UNSET
    compat: Compat | UnsetType = UNSET

    @property
    def streams(self) -> bool:
        """``stream`` is set true."""
        return self.stream is True

    @property
    def wire_compat(self) -> WireCompat:
        """The wire settings requests are built with: ``profile``'s, ``compat`` over them."""
        return resolve(self.profile, self.compat)

    @property
    def model_name(self) -> str:
        """The model name a request carries: ``model``, else ``name``, else the adapter."""
        return self.model if isinstance(self.model, str) else (self.name or self.adapter)

    @property
    def request_params(self) -> dict[str, Any]:
        """The extra body fields of every request (``params``; empty when unset)."""
        return dict(self.params) if isinstance(self.params, dict) else {}

    @property
    def scripted_turns(self) -> tuple[ScriptedTurn, ...]:
        """``turns``, empty when unset."""
        return self.turns if isinstance(self.turns, tuple) else ()

    @property
    def timeout(self) -> float:
        """``timeout_s`` or the default (s)."""
        return self.timeout_s if isinstance(self.timeout_s, float | int) else DEFAULT_TIMEOUT_S

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        """USD of one call under ``price`` (0 when no price is given)."""
        return self.price.cost_usd(input_tokens, output_tokens) if isinstance(self.price, Price) else 0.0


def check_model_spec(m: ModelSpec, where: str) -> None:
    """Semantic checks of one model spec at ``where`` (e.g. ``$.steps[0].model``).

    Raises:
        WorkflowInvalid: naming the field of the first problem.
    """
    if m.adapter not in MODEL_ADAPTERS and not IMPORT_PATH.match(m.adapter):
        raise WorkflowInvalid(
            f"unknown model adapter {m.adapter!r}; known: {', '.join(MODEL_ADAPTERS)}, or module:factory"
            f" (at `{where}.adapter`)"
        )
    if m.adapter == "replay" and m.output is None and not m.scripted_turns:
        raise WorkflowInvalid(f"replay adapter needs `output` (at `{where}.output`)")
    if m.adapter == "scripted" and not m.outputs and not m.scripted_turns:
        raise WorkflowInvalid(f"scripted adapter needs `outputs` (at `{where}.outputs`)")
    if m.adapter == "openai":
        _check_openai(m, where)
    _check_common(m, where)
    for j, turn in enumerate(m.scripted_turns):
        at = f"{where}.turns[{j}]"
        if not turn.text and not turn.tool_calls:
            raise WorkflowInvalid(f"a scripted turn needs `text` or `tool_calls` (at `{at}`)")
        for k, call in enumerate(turn.tool_calls):
            if not call.name:
                raise WorkflowInvalid(f"a scripted tool call needs a `name` (at `{at}.tool_calls[{k}].name`)")


def _check_openai(m: ModelSpec, where: str) -> None:
    for field in ("model", "base_url"):
        value = getattr(m, field)
        if not isinstance(value, str) or not value:
            raise WorkflowInvalid(f"openai adapter needs `{field}` (at `{where}.{field}`)")
    assert isinstance(m.base_url, str)
    if not m.base_url.startswith(("http://", "https://")):
        raise WorkflowInvalid(f"base_url {m.base_url!r} must start with http:// or https:// (at `{where}.base_url`)")


def _check_common(m: ModelSpec, where: str) -> None:
    if isinstance(m.api_key_env, str) and not _ENV_NAME.match(m.api_key_env):
        raise WorkflowInvalid(f"api_key_env must be the NAME of an environment variable, e.g. OPENAI_API_KEY"
                              f" (at `{where}.api_key_env`)")
    for key in RESERVED_PARAMS:
        if key in m.request_params:
            raise WorkflowInvalid(f"params may not set `{key}`: Reel sets it (to stream, set `stream: true` on the"
                                  f" model) (at `{where}.params.{key}`)")
    if m.streams and m.adapter not in STREAMING_ADAPTERS and not IMPORT_PATH.match(m.adapter):
        raise WorkflowInvalid(f"the {m.adapter} adapter does not stream; `stream: true` needs openai or an adapter"
                              f" of your own (at `{where}.stream`)")
    if isinstance(m.profile, str) and m.profile not in PROFILES:
        raise WorkflowInvalid(f"unknown model profile {m.profile!r}; known: {', '.join(PROFILES)}"
                              f" (at `{where}.profile`)")
    if isinstance(m.timeout_s, float | int) and m.timeout_s <= 0:
        raise WorkflowInvalid(f"timeout_s must be > 0 (at `{where}.timeout_s`)")
    if isinstance(m.price, Price):
        for field in ("input_usd_per_mtok", "output_usd_per_mtok"):
            if getattr(m.price, field) < 0:
                raise WorkflowInvalid(f"price may not be negative (at `{where}.price.{field}`)")
