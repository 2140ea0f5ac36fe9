"""SWE-agent ``*.traj`` (0.x and 1.x) → :class:`~reel.shared.core.trajectories.recording.Recording` (one run per file).

Both versions write ``{trajectory, history, info, …}``; ``history`` is the exact model
context, one entry per message (``sweagent/types.py`` ``HistoryItem``: ``role``,
``content``, ``agent``, ``message_type``, ``is_demo``, ``action``, ``tool_calls``,
``tool_call_ids``). Detected as one format; the differences are per entry:

* **Which agent.** The agent that made the first assistant message (``primary`` in
  0.x, ``main`` in 1.x, any other name too) is the one replayed; entries of other agents
  (and entries without ``agent`` count as its own) are left out.
* **Model turns.** Every ``assistant`` message. With tool calls (1.x function calling:
  ``tool_calls``, a list of ``{id, type, function: {name, arguments}}`` — or that list
  stored as a stringified Python repr, parsed with :func:`ast.literal_eval`, never
  evaluated) those are the turn's calls; without, the turn gets one call of a ``bash``
  tool whose arguments are ``{"command": <the message's action>}`` (0.x, and 1.x's
  thought/action parsers: SWE-agent's ACI commands are shell functions).
* **Observations.** A ``tool`` message answers the call its ``tool_call_ids`` (a list,
  or a stringified one) names; a (non-demo) ``user`` message right after a turn answers
  that turn's call. ``system`` → ``system``; ``is_demo`` messages (``message_type:
  demonstration``) → ``demo``; the first other user message (the issue) → ``task``.
* A last action whose observation is only in ``trajectory`` (usually ``submit`` → the
  diff) is appended from there.

``model`` comes from 1.x's ``replay_config`` (``agent.model.name``) when present;
``agent`` names the version (``info.swe_agent_version``). SWE-agent files carry no
outcome label.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import msgspec

from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.trajectories.recording import (
    Entry,
    Lit,
    Obs,
    Recording,
    ToolCall,
    Turn,
    answer_with_call,
    args_text,
    convert,
    dig,
    has_kind,
    maybe_json,
    native_turn,
    source,
    str_or_none,
    text,
)

_SWEBENCH_ID = re.compile(r"([A-Za-z0-9-]+__[A-Za-z0-9_.-]+-\d+)$")
BASH = "bash"
"""The tool a turn without native tool calls calls (its action is a shell command)."""


class _SweMsg(msgspec.Struct):
    role: str
    content: str | list[Any] | None  # required (HistoryItem), may be null
    agent: str | None = None
    is_demo: bool = False
    action: str | None = None
    message_type: str | None = None
    tool_calls: list[Any] | str | None = None
    tool_call_ids: list[Any] | str | None = None


class _SweStep(msgspec.Struct):
    response: str = ""
    action: str = ""
    observation: str = ""


class _SweTraj(msgspec.Struct):
    trajectory: list[_SweStep]
    history: list[_SweMsg]
    info: dict[str, Any] = {}
    environment: str = ""
    replay_config: str | dict[str, Any] | None = None


def listish(value: list[Any] | str | None, where: str) -> list[Any]:
    """A history entry's ``tool_calls`` / ``tool_call_ids``: a list as stored, or parsed from its string form.

    Real files hold either a JSON list or the list's Python repr as a string
    (``"[{'id': 'call_1', …}]"``); the string is read as JSON, else with
    :func:`ast.literal_eval` (literals only: nothing is evaluated). ``None``, ``""``,
    ``"None"`` and ``"[]"`` are no list.

    Raises:
        TrajectoryFormatError: a string that is neither, or a value that is not a list; the message names ``where``.
    """
    if value is None:
        return []
    if isinstance(value, list):
        return value
    s = value.strip()
    if s in ("", "None", "null"):
        return []
    parsed = maybe_json(s)
    if parsed is None:
        try:
            parsed = ast.literal_eval(s)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            raise TrajectoryFormatError(f"{where}: not a list literal ({type(exc).__name__}): {s[:80]!r}") from None
    if parsed is None:
        return []
    if not isinstance(parsed, list | tuple):
        raise TrajectoryFormatError(f"{where}: expected a list, found {type(parsed).__name__}: {s[:80]!r}")
    return list(parsed)


def _calls(m: _SweMsg, where: str) -> list[ToolCall]:
    raw = listish(m.tool_calls, f"{where}.tool_calls")
    return [convert(c, ToolCall, f"{where}.tool_calls[{k}]", "a SWE-agent tool call") for k, c in enumerate(raw)]


def _main_agent(history: list[_SweMsg]) -> str | None:
    return next((m.agent for m in history if m.role == "assistant"), None)


def parse(data: Any, p: Path, limit: int | None) -> list[Recording]:
    """The one run of a SWE-agent trajectory (``limit`` does not apply: one run per file).

    Raises:
        TrajectoryFormatError: the document does not match the format's schema, or a
            ``tool_calls`` / ``tool_call_ids`` value is not a list (nor one's string form).
    """
    t = convert(data, _SweTraj, str(p), "a SWE-agent trajectory")
    agent_name = _main_agent(t.history)
    hist = [m for m in t.history if m.agent is None or m.agent == agent_name]
    entries: list[Entry] = []
    open_calls: list[ToolCall] = []
    prev = ""
    for i, m in enumerate(hist):
        mid, body, where = f"m{i:04d}", text(m.content), f"{p}: history[{i}]"
        demo = m.is_demo or m.message_type == "demonstration"
        if m.role == "assistant":
            open_calls = _calls(m, where)
            entries.append(native_turn(mid, body, open_calls) if open_calls else Turn(mid, body))
        elif m.role == "tool" and prev in ("assistant", "tool"):
            ids = [str(x) for x in listish(m.tool_call_ids, f"{where}.tool_call_ids")]
            entries.append(_answer(entries, open_calls, mid, body, hist[i - 1], ids[0] if ids else None))
        elif m.role == "user" and prev == "assistant" and not demo:
            entries.append(_answer(entries, open_calls, mid, body, hist[i - 1], None))
        else:
            kind = ("system" if m.role == "system" else "demo" if demo
                    else "task" if not has_kind(entries, "task") else "message")
            entries.append(Lit(mid, kind, body))
        prev = m.role
    last = t.trajectory[-1] if t.trajectory else None
    if prev == "assistant" and last is not None and last.response == text(hist[-1].content):
        entries.append(_answer(entries, open_calls, f"m{len(hist):04d}", last.observation, hist[-1], None,
                               action=last.action))
    found = _SWEBENCH_ID.search(p.name.removesuffix(".traj"))
    instance = found.group(1) if found else p.stem
    version = str_or_none(t.info.get("swe_agent_version"))
    agent = "SWE-agent" + (f" {version}" if version else "") + (f" ({t.environment})" if t.environment else "")
    config = maybe_json(t.replay_config) if isinstance(t.replay_config, str) else t.replay_config
    model = str_or_none(dig(config, "agent", "model", "name")) or ""
    src = source(p, "swe-agent", agent, model, instance, str_or_none(t.info.get("exit_status")), None)
    src["trajectory_steps"] = len(t.trajectory)
    src["swe_agent_version"] = version or "0.x"
    return [Recording(name=instance, where=str(p), model=model, entries=entries, source=src)]


def _answer(entries: list[Entry], calls: list[ToolCall], mid: str, body: str, turn_msg: _SweMsg,
            call_id: str | None, *, action: str | None = None) -> Obs:
    """The observation ``body`` answering the latest turn: the call ``call_id`` names (else its first call),
    or, for a turn without native calls, its ``bash`` action (the call is made here)."""
    if calls:
        which = next((k for k, c in enumerate(calls) if c.id == call_id), 0)
        c = calls[which]
        return Obs(mid, c.function.name or BASH, args_text(c.function.arguments), body, call=which)
    command = (turn_msg.action if action is None else action) or ""
    command = command.rstrip("\n")
    return Obs(mid, BASH, command, body, call=answer_with_call(entries, BASH, {"command": command}))
