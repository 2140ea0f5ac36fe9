"""The format-neutral recording every format parser produces, and the helpers they share.

A parser (one module per format) turns one decoded file into :class:`Recording` s:
an ordered list of entries — :class:`Lit` (a message no step produced),
:class:`Turn` (a recorded model turn) and :class:`Obs` (the environment's answer
to the latest turn) — plus the run's name, model and ``source`` metadata.
:func:`reel.shared.core.trajectories.builder.build` maps a recording to a workflow.

Also here: the OpenAI-style chat shapes (validated with msgspec at the edge) that
mini-swe-agent, tau-bench and OpenHands share, and how a model output is rendered
as text (``<tool_call>{"name": …, "arguments": …}</tool_call>`` lines).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.workflow.spec import RecordedUsage

_T = TypeVar("_T")


# ---------------------------------------------------------------- the format-neutral recording
class Lit(msgspec.Struct, frozen=True):
    """A message no step produced: literal text in every later context."""

    id: str
    kind: str
    text: str


class Call(msgspec.Struct, frozen=True):
    """A tool call of a recorded turn: the provider's id (``""``: none recorded), the tool, raw JSON arguments."""

    id: str
    name: str
    arguments: str = "{}"


class Turn(msgspec.Struct, frozen=True):
    """A recorded model turn.

    Attributes:
        output: the turn as text (native tool calls rendered as ``<tool_call>`` lines; the linear form).
        text: the assistant message's content (the agent form; ``None``: same as ``output``).
        calls: its tool calls (native ones, or the shell action / reply a parser made one of).
    """

    id: str
    output: str
    usage: RecordedUsage | None = None
    text: str | None = None
    calls: tuple[Call, ...] = ()

    @property
    def content(self) -> str:
        """The assistant message's text."""
        return self.output if self.text is None else self.text


class Obs(msgspec.Struct, frozen=True):
    """The environment's answer to the latest turn (a recorded tool step; ``call``: the index of the call it
    answers in that turn's ``calls``, ``None`` when it answers none)."""

    id: str
    name: str
    input: str
    output: str
    kind: str = "observation"
    call: int | None = None


Entry = Lit | Turn | Obs


class Recording(msgspec.Struct, kw_only=True):
    """One recorded run of a file, format-neutral.

    Attributes:
        name: the workflow's name (instance id, or ``<file stem>-task<id>-trial<n>``).
        where: the file (and record/episode) for error messages.
        model: the recorded model's name, ``""`` if unknown.
        entries: the messages in file order.
        source: the workflow's ``source`` metadata (see :func:`source`).
        outcome: the file's success label, ``None`` when it has none.
    """

    name: str
    where: str
    model: str
    entries: list[Entry]
    source: dict[str, Any]
    outcome: bool | None = None


Parser = Callable[[Any, Path, int | None], list[Recording]]
"""``parse(data, path, limit) -> recordings``: one format's parser of decoded JSON (``limit``: first N runs)."""


def has_kind(entries: list[Entry], kind: str) -> bool:
    """Whether a literal entry of ``kind`` was already recorded (the first user message is the ``task``)."""
    return any(isinstance(e, Lit) and e.kind == kind for e in entries)


def source(p: Path, fmt: str, agent: str, model: str, instance: str, exit_status: str | None,
           outcome: bool | None) -> dict[str, Any]:
    """The common ``source`` keys of a replayed workflow (formats add their own)."""
    return {"file": str(p), "format": fmt, "agent": agent, "model": model or None, "instance_id": instance,
            "exit_status": exit_status, "outcome": outcome}


def convert(data: Any, typ: type[_T], where: str, fmt: str) -> _T:
    """``data`` validated as ``typ``.

    Raises:
        TrajectoryFormatError: it does not match; the message names ``where``, ``fmt`` and the JSON path.
    """
    try:
        return msgspec.convert(data, typ)
    except msgspec.ValidationError as exc:
        raise TrajectoryFormatError(f"{where}: looks like {fmt} but does not match its schema: {exc}") from None


def dig(d: Any, *keys: str) -> Any:
    """``d[k1][k2]…``, or ``None`` as soon as a level is not a dict."""
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def str_or_none(v: Any) -> str | None:
    """``v`` if it is a non-empty string, else ``None``."""
    return v if isinstance(v, str) and v else None


def maybe_json(s: str) -> Any:
    """``s`` decoded as JSON, or ``None`` if it is not JSON."""
    try:
        return msgspec.json.decode(s)
    except msgspec.DecodeError:
        return None


# ---------------------------------------------------------------- OpenAI-style chat shapes
class Fn(msgspec.Struct):
    """A tool call's function: name and arguments (a JSON string or an object)."""

    name: str = ""
    arguments: str | dict[str, Any] = ""


class ToolCall(msgspec.Struct):
    """A native tool call of a chat message."""

    function: Fn
    id: str = ""


class Msg(msgspec.Struct):
    """An OpenAI-style chat message (mini-swe-agent, tau-bench, OpenHands model responses)."""

    role: str = "assistant"
    content: str | list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    extra: dict[str, Any] = {}


class Usage(msgspec.Struct):
    """A response's token usage (tokens) and cost (USD), where recorded."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None


class Choice(msgspec.Struct):
    """One choice of a chat completion response."""

    message: Msg


class Response(msgspec.Struct):
    """A recorded chat completion response."""

    id: str = ""
    model: str = ""
    choices: list[Choice] = []
    usage: Usage | None = None


def text(content: str | list[Any] | None) -> str:
    """Message content as text; a list of content parts keeps its ``text`` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)


def args_text(arguments: str | dict[str, Any]) -> str:
    """Tool-call arguments as text (an object is JSON-encoded)."""
    return arguments if isinstance(arguments, str) else msgspec.json.encode(arguments).decode()


def render(content: str, calls: Sequence[ToolCall]) -> str:
    """A model output as text: its content, then one ``<tool_call>`` line per native tool call."""
    parts = [content] if content else []
    for c in calls:
        args: Any = c.function.arguments
        if isinstance(args, str) and (parsed := maybe_json(args)) is not None:
            args = parsed
        call = msgspec.json.encode({"name": c.function.name, "arguments": args}).decode()
        parts.append(f"<tool_call>{call}</tool_call>")
    return "\n".join(parts)


def native_turn(mid: str, content: str, calls: Sequence[ToolCall], usage: RecordedUsage | None = None) -> Turn:
    """A turn of a chat message with native tool calls: ``output`` rendered, ``text`` and ``calls`` as recorded."""
    return Turn(mid, render(content, calls), usage, text=content,
                calls=tuple(Call(c.id, c.function.name, args_text(c.function.arguments)) for c in calls))


def answer_with_call(entries: list[Entry], name: str, arguments: dict[str, Any]) -> int:
    """Give the latest entry (a turn without calls) one call ``name(arguments)``; its index (0).

    For formats whose actions are not native tool calls: mini-swe-agent's and SWE-agent's
    shell command, tau-bench's reply to the user. The call has no provider id (Reel assigns
    one, as for a live model that returned none).
    """
    turn = entries[-1]
    assert isinstance(turn, Turn) and not turn.calls
    args = msgspec.json.encode(arguments).decode()
    entries[-1] = msgspec.structs.replace(turn, text=turn.content, calls=(Call("", name, args),))
    return 0


def response(raw: Any) -> Response | None:
    """``raw`` as a :class:`Response`, or ``None`` if it is not one."""
    try:
        return msgspec.convert(raw, Response) if isinstance(raw, dict) else None
    except msgspec.ValidationError:
        return None


def usage(resp: Response | None) -> RecordedUsage | None:
    """The recorded usage of a response, ``None`` when it has no token counts."""
    u = resp.usage if resp else None
    if u is None or (u.prompt_tokens is None and u.completion_tokens is None):
        return None
    return RecordedUsage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens, cost_usd=u.cost or 0.0)
