"""Wire compatibility of an OpenAI-compatible server: named profiles and per-spec overrides (docs/models.md).

Servers that speak the chat-completions format still differ in what they accept. A model
spec names a **profile** (``profile: llama-cpp-python``) and may override any of its
settings (``compat: {tool_call_content: omit}``); :func:`resolve` turns the two into the
:class:`WireCompat` that :func:`reel.shared.core.chat.messages.chat_request` and
:func:`~reel.shared.core.chat.messages.wire_request` apply. Unset, everything is the
default, which every listed server accepts.

Settings:

* ``tool_call_content`` — the ``content`` of an assistant message that carries tool calls
  and no text: ``empty`` (``""``, the default: accepted by OpenAI, vLLM, llama.cpp's
  ``llama-server``, llama-cpp-python, Ollama and LiteLLM), ``null`` (OpenAI's own
  examples; llama-cpp-python's server answers HTTP 500 ``Input should be a valid string``)
  or ``omit`` (no ``content`` key; llama-cpp-python's chat template then fails with 500).
* ``stream_tool_turns`` — with ``stream: true``, stream also the turns that offer tools
  (default true). False sends those turns unstreamed (``stream`` absent from the body)
  and streams only the turns without tools: for a server that cannot stream a tool
  choice (llama-cpp-python answers 200 and then breaks the stream).
* ``parallel_tool_calls`` — sent as the body's ``parallel_tool_calls`` when tools are
  offered (unset: not sent; a spec's ``params.parallel_tool_calls`` wins).

Pure data: no I/O.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

ToolCallContent = Literal["empty", "null", "omit"]


class Compat(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A spec's overrides of its profile's settings (each unset: the profile's)."""

    tool_call_content: ToolCallContent | UnsetType = UNSET
    stream_tool_turns: bool | UnsetType = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET


class WireCompat(msgspec.Struct, frozen=True, kw_only=True):
    """The resolved settings a request is built with (module docstring); ``parallel_tool_calls`` None: not sent."""

    tool_call_content: ToolCallContent = "empty"
    stream_tool_turns: bool = True
    parallel_tool_calls: bool | None = None


DEFAULT = WireCompat()
PROFILES: dict[str, WireCompat] = {
    "openai": DEFAULT,
    "vllm": DEFAULT,
    "llama-server": DEFAULT,
    "llama-cpp-python": WireCompat(stream_tool_turns=False, parallel_tool_calls=False),
    "ollama": DEFAULT,
    "litellm": DEFAULT,
}
"""Profile name → settings: what each server's documentation (and, for llama-cpp-python, the real-server
suite) says it accepts (docs/models.md, "Servers and profiles")."""


def resolve(profile: str | UnsetType, compat: Compat | UnsetType) -> WireCompat:
    """The settings of ``profile`` (unset: :data:`DEFAULT`) with ``compat``'s set fields over them.

    Raises:
        KeyError: ``profile`` is not in :data:`PROFILES` (workflow validation refuses it earlier).
    """
    base = PROFILES[profile] if isinstance(profile, str) else DEFAULT
    if not isinstance(compat, Compat):
        return base
    changes = {f: v for f in compat.__struct_fields__ if (v := getattr(compat, f)) is not UNSET}
    return msgspec.structs.replace(base, **changes)
