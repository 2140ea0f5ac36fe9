"""Prompts and outputs as a conversation: pure functions of a body's bytes (no I/O).

An agent turn's prompt blob is the chat-completions request body sent (``{model, messages, tools, …}``,
docs/models.md) and its output blob the response message as the provider sent it (``{role, content,
tool_calls}``). :func:`conversation` reads either into :class:`Conversation` — one :class:`Message` per
message (system / user / assistant / tool), an assistant's tool calls with their arguments, a tool
message with the name of the call it answers — for the run page to show as a chat instead of one line of
JSON. Nothing is dropped silently: a field it does not show as part of a message is listed in
:attr:`Conversation.params`; the raw bytes stay one click away.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Call:
    """One tool call of an assistant message.

    Attributes:
        call_id: the call's id as sent (``""`` if none).
        arguments: the arguments text as sent.
        valid: they parse as a JSON object.
        fields: when ``valid``, each argument as ``(name, text)``: a string as it is (its newlines as lines),
            any other value as its JSON.
    """

    call_id: str
    name: str
    arguments: str
    valid: bool
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Message:
    """One message of a conversation.

    Attributes:
        content: its text (text parts joined by a blank line; any other part as its JSON), ``""`` if none.
        tool_call_id, tool_name: for a ``tool`` message, the call it answers and that call's tool (``""``
            when no earlier message of the conversation made the call).
        extra: the message's other fields as ``(key, JSON text)`` (``name``, ``refusal``…).
    """

    role: str
    content: str = ""
    calls: tuple[Call, ...] = ()
    tool_call_id: str = ""
    tool_name: str = ""
    extra: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Conversation:
    """A request (``kind == "request"``: messages sent, the ``model`` asked and the ``tools`` offered, by
    name), one response message (``kind == "message"``) or a text body as one message (``kind == "text"``,
    :func:`as_message`); ``params``: every other top-level field as ``(key, JSON text)`` (``tool_choice``,
    ``temperature``, ``stream``…)."""

    kind: str
    messages: tuple[Message, ...]
    model: str = ""
    tools: tuple[str, ...] = ()
    params: tuple[tuple[str, str], ...] = ()


def conversation(body: bytes) -> Conversation | None:
    """The conversation ``body`` holds, or ``None`` if it is not a chat request or message: not UTF-8 JSON, not
    an object, no ``messages`` list of message objects (a request) and no string ``role`` (a message)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    msgs = data.get("messages")
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                               for m in msgs):
        names: dict[str, str] = {}
        out = tuple(_message(m, names) for m in msgs)
        tools = data.get("tools")
        return Conversation(kind="request", messages=out, model=str(data.get("model") or ""),
                            tools=tuple(_tool_name(t) for t in tools) if isinstance(tools, list) else (),
                            params=tuple((k, _json(v)) for k, v in data.items()
                                         if k not in ("messages", "model", "tools")))
    if isinstance(data.get("role"), str):
        return Conversation(kind="message", messages=(_message(data, {}),))
    return None


def as_message(body: bytes, role: str) -> Conversation | None:
    """``body`` as :func:`conversation` reads it, else its UTF-8 text as one ``role`` message (``kind ==
    "text"``): a model step's output, the assistant's text, or its prompt in a run recorded before that
    prompt was its request (the text sent as the one user message). ``None`` if neither (not UTF-8)."""
    found = conversation(body)
    if found is not None:
        return found
    try:
        return Conversation(kind="text", messages=(Message(role=role, content=body.decode("utf-8")),))
    except UnicodeDecodeError:
        return None


def _message(m: dict[str, Any], names: dict[str, str]) -> Message:
    """One message; ``names`` maps the call ids seen so far to their tools (filled by assistant messages)."""
    calls = tuple(_call(c) for c in m.get("tool_calls") or () if isinstance(c, dict))
    for c in calls:
        if c.call_id:
            names[c.call_id] = c.name
    call_id = m.get("tool_call_id")
    call_id = call_id if isinstance(call_id, str) else ""
    shown = {"role", "content", "tool_calls", "tool_call_id"}
    return Message(role=m["role"], content=_content(m.get("content")), calls=calls, tool_call_id=call_id,
                   tool_name=names.get(call_id, "") if call_id else "",
                   extra=tuple((k, _json(v)) for k, v in m.items() if k not in shown and v is not None))


def _call(c: dict[str, Any]) -> Call:
    f = c.get("function")
    fn: dict[str, Any] = f if isinstance(f, dict) else c
    args = fn.get("arguments", "")
    text = args if isinstance(args, str) else _json(args)
    call_id, name = str(c.get("id") or ""), str(fn.get("name") or "?")
    try:
        parsed = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        return Call(call_id=call_id, name=name, arguments=text, valid=False)
    return Call(call_id=call_id, name=name, arguments=text, valid=True,
                fields=tuple((str(k), v if isinstance(v, str) else _json(v)) for k, v in parsed.items()))


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(p["text"] if isinstance(p, dict) and p.get("type") == "text" and isinstance(
            p.get("text"), str) else _json(p) for p in content)
    return _json(content)


def _tool_name(t: Any) -> str:
    fn = t.get("function") if isinstance(t, dict) else None
    return str(fn.get("name")) if isinstance(fn, dict) and fn.get("name") else _json(t)[:80]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
