"""Assembling a streamed chat-completions response (``stream: true``), chunk by chunk. Pure: no I/O.

A provider streams ``chat.completion.chunk`` objects: ``choices[0].delta`` carries a fragment
of the assistant message — ``content`` text, or ``tool_calls`` fragments keyed by ``index``
(the first fragment of a call carries its ``id``, ``type`` and ``function.name``, the next
ones pieces of ``function.arguments``) — ``choices[0].finish_reason`` ends it, and with
``stream_options: {include_usage: true}`` a last chunk with no choice carries ``usage``.

:class:`StreamAssembler` turns each chunk into the :class:`~reel.shared.core.wire.livemessages.StreamChunk`
published for it (``None`` when it carries no fragment) and, at the end, into the body of
an ordinary (non-streamed) response — ``{"choices": [{"message", "finish_reason"}], "usage",
"model"}`` — which :func:`reel.shared.core.chat.messages.response_from_wire` reads like any other. So the
attempt's output blob is the assembled message, exactly what a non-streamed call returns:
``{"role": "assistant", "content": …, "tool_calls": [{"id", "type", "function": {"name",
"arguments"}}]}`` (``tool_calls`` only when there are any), the calls in index order.

Source: OpenAI API reference, "The chat completion chunk object" and ``stream_options``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reel.shared.core.errors import ModelError
from reel.shared.core.wire.livemessages import StreamChunk, ToolCallDelta


class _Call:
    __slots__ = ("arguments", "id", "name", "type")

    def __init__(self) -> None:
        self.id, self.type, self.name = "", "function", ""
        self.arguments: list[str] = []


def _broken(what: str) -> ModelError:
    return ModelError(f"the response stream broke: {what}", kind="stream_broken", retryable=True)


class StreamAssembler:
    """One streamed response, as its chunks arrive (:meth:`add`), then whole (:meth:`body`)."""

    def __init__(self) -> None:
        self.chunks = 0
        self.role = "assistant"
        self.content: list[str] = []
        self.saw_content = False
        self.calls: dict[int, _Call] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.model = ""
        self.id = ""

    def add(self, chunk: Mapping[str, Any]) -> StreamChunk | None:
        """Take one ``chat.completion.chunk`` (decoded JSON); the fragment to publish for it, if any.

        Raises:
            ModelError: ``malformed_response`` (retryable): the chunk is not shaped like one.
        """
        self.chunks += 1
        self.model = str(chunk.get("model") or self.model)
        self.id = str(chunk.get("id") or self.id)
        if isinstance(chunk.get("usage"), dict):
            self.usage = dict(chunk["usage"])
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ModelError("malformed stream chunk: `choices` is not a list", kind="malformed_response")
        choice = next((c for c in choices if isinstance(c, dict) and (c.get("index") or 0) == 0), None)
        if choice is None:
            return None
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise ModelError("malformed stream chunk: `delta` is not an object", kind="malformed_response")
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        text = delta.get("content")
        if text is not None:
            self.saw_content = True
        text = text if isinstance(text, str) else ""
        if text:
            self.content.append(text)
        calls = tuple(self._call_fragment(c) for c in (delta.get("tool_calls") or []) if isinstance(c, dict))
        if not text and not calls:
            return None
        return StreamChunk(seq=0, content=text, tool_calls=calls)

    def _call_fragment(self, raw: Mapping[str, Any]) -> ToolCallDelta:
        index = int(raw.get("index") or 0)
        call = self.calls.setdefault(index, _Call())
        fn = raw.get("function") if isinstance(raw.get("function"), dict) else {}
        assert isinstance(fn, dict)
        if raw.get("id"):
            call.id = str(raw["id"])
        if raw.get("type"):
            call.type = str(raw["type"])
        name, args = fn.get("name"), fn.get("arguments")
        name, args = name if isinstance(name, str) else "", args if isinstance(args, str) else ""
        if name:
            call.name += name
        if args:
            call.arguments.append(args)
        return ToolCallDelta(index=index, id=str(raw.get("id") or ""), name=name, arguments=args)

    def message(self) -> dict[str, Any]:
        """The assistant message assembled so far (the output blob's body once the stream is complete)."""
        text = "".join(self.content)
        out: dict[str, Any] = {"role": self.role, "content": text if text or self.saw_content else None}
        if self.calls:
            out["tool_calls"] = [{"id": c.id, "type": c.type, "function": {"name": c.name,
                                                                           "arguments": "".join(c.arguments)}}
                                 for _, c in sorted(self.calls.items())]
        return out

    def body(self) -> dict[str, Any]:
        """The whole response, shaped as a non-streamed one.

        Raises:
            ModelError: ``stream_broken`` (retryable): the stream ended before a ``finish_reason``.
        """
        if self.finish_reason is None:
            raise _broken(f"it ended after {self.chunks} chunks without a finish_reason")
        out: dict[str, Any] = {"id": self.id, "object": "chat.completion", "model": self.model, "choices": [
            {"index": 0, "message": self.message(), "finish_reason": self.finish_reason}]}
        if self.usage is not None:
            out["usage"] = self.usage
        return out


def broken(after_chunks: int, cause: str) -> ModelError:
    """The error of a stream that broke mid-way (``stream_broken``, retryable: a new attempt calls again)."""
    return _broken(f"after {after_chunks} chunks: {cause}")
