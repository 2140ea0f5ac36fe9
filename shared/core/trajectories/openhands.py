"""OpenHands evaluation ``output.jsonl`` (one record per line) → one :class:`Recording` per record.

Events are keyed by their id (``e0042``). An agent action with tool-call metadata
is a model turn (once per model response: parallel calls share it, and are its
calls) and opens a tool; the observation that names it as ``cause`` is that tool's result. Agent
text messages are turns too; system and user messages, recalls and uncaused
observations are literals. OpenHands records carry no outcome label.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from reel.shared.core.trajectories.recording import (
    Entry,
    Lit,
    Msg,
    Obs,
    Recording,
    Response,
    Turn,
    args_text,
    convert,
    dig,
    has_kind,
    maybe_json,
    native_turn,
    source,
    str_or_none,
    text,
    usage,
)


class _OhTcm(msgspec.Struct):
    function_name: str = ""
    tool_call_id: str = ""
    model_response: Response = msgspec.field(default_factory=Response)


class _OhEvent(msgspec.Struct):
    id: int
    source: str = ""
    message: str = ""
    action: str | None = None
    observation: str | None = None
    cause: int | None = None
    content: str = ""
    args: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    tool_call_metadata: _OhTcm | None = None


class _OhRecord(msgspec.Struct):
    instance_id: str
    history: list[_OhEvent]
    metadata: dict[str, Any] = {}
    error: str | None = None


def parse(data: Any, p: Path, limit: int | None) -> list[Recording]:
    """The file's records in order (a one-line file decodes to one), the first ``limit`` of them if given.

    Raises:
        TrajectoryFormatError: a record does not match the format's schema (the message names its line).
    """
    records = data if isinstance(data, list) else [data]
    if limit is not None:
        records = records[:limit]
    return [_record(raw, p, i) for i, raw in enumerate(records)]


def _record(raw: Any, p: Path, index: int) -> Recording:
    where = f"{p} (record {index + 1})"
    r = convert(raw, _OhRecord, where, "an OpenHands output record")
    entries: list[Entry] = []
    tools: dict[int, tuple[str, str, int | None]] = {}
    responses: set[str] = set()
    model = ""
    for ev in r.history:
        eid = f"e{ev.id:04d}"
        tcm = ev.tool_call_metadata
        if ev.action == "system" or (ev.action == "message" and ev.source == "user"):
            body = str_or_none(ev.args.get("content")) or ev.message
            kind = "system" if ev.action == "system" else "task" if not has_kind(entries, "task") else "message"
            entries.append(Lit(eid, kind, body))
        elif ev.action is not None and ev.source == "agent" and tcm is not None:
            resp = tcm.model_response
            if resp.id not in responses or not resp.id:
                responses.add(resp.id)
                model = model or resp.model
                msg = resp.choices[0].message if resp.choices else Msg()
                entries.append(native_turn(eid, text(msg.content), msg.tool_calls or [], usage(resp)))
            tools[ev.id] = (tcm.function_name, _tool_input(tcm), _call_index(tcm))
        elif ev.action == "message" and ev.source == "agent":
            entries.append(Turn(eid, str_or_none(ev.args.get("content")) or ev.message))
        elif ev.observation is not None and ev.cause in tools:
            name, tool_input, which = tools.pop(ev.cause)
            entries.append(Obs(eid, name or ev.observation, tool_input, ev.content, call=which))
        elif ev.observation is not None and (body := _obs_text(ev)):
            entries.append(Lit(eid, "message" if ev.observation == "recall" else "observation", body))
    model = model or str_or_none(dig(r.metadata, "llm_config", "model")) or ""
    exit_status = "error" if r.error else "finished" if any(e.action == "finish" for e in r.history) else None
    agent = str_or_none(r.metadata.get("agent_class")) or "OpenHands"
    src = source(p, "openhands", f"OpenHands {agent}", model, r.instance_id, exit_status, None)
    src.update(error=r.error, record=index + 1)
    return Recording(name=r.instance_id, where=where, model=model, entries=entries, source=src)


def _call_index(tcm: _OhTcm) -> int | None:
    """Which call of its model response an action is (by ``tool_call_id``)."""
    msg = tcm.model_response.choices[0].message if tcm.model_response.choices else Msg()
    return next((i for i, c in enumerate(msg.tool_calls or []) if c.id == tcm.tool_call_id), None)


def _tool_input(tcm: _OhTcm) -> str:
    """The recorded tool call: the shell command for ``execute_bash``, else the JSON arguments."""
    msg = tcm.model_response.choices[0].message if tcm.model_response.choices else Msg()
    call = next((c for c in msg.tool_calls or [] if c.id == tcm.tool_call_id), None)
    if call is None:
        return ""
    args = call.function.arguments
    if tcm.function_name == "execute_bash":
        parsed = args if isinstance(args, dict) else maybe_json(args)
        if isinstance(parsed, dict) and isinstance(parsed.get("command"), str):
            return str(parsed["command"])
    return args_text(args)


def _obs_text(ev: _OhEvent) -> str:
    """An observation no recorded tool call caused (recall, format errors) as the model saw it, roughly."""
    parts = [ev.content or ev.message]
    for k in ev.extras.get("microagent_knowledge") or ():
        if isinstance(k, dict) and isinstance(k.get("content"), str):
            parts.append(k["content"])
    return "\n\n".join(x for x in parts if x)
