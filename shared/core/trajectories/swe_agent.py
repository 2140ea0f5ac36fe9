"""SWE-agent 0.x ``*.traj`` → :class:`~shared.core.trajectories.recording.Recording` (one run per file).

Only the ``primary`` agent's history is replayed. Assistant messages are model
turns; a (non-demo) user message answering one is the observation of the
previous message's ``action``, which becomes the turn's call of a ``bash`` tool;
in-context demonstrations are ``demo`` literals.
A last action whose observation is only in ``trajectory`` is appended from there.
SWE-agent files carry no outcome label.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from shared.core.trajectories.recording import (
    Entry,
    Lit,
    Obs,
    Recording,
    Turn,
    answer_with_call,
    convert,
    has_kind,
    source,
    str_or_none,
    text,
)

_SWEBENCH_ID = re.compile(r"([A-Za-z0-9-]+__[A-Za-z0-9_.-]+-\d+)$")


class _SweMsg(msgspec.Struct):
    role: str
    content: str | list[Any]
    agent: str = "primary"
    is_demo: bool = False
    action: str | None = None


class _SweStep(msgspec.Struct):
    response: str = ""
    action: str = ""
    observation: str = ""


class _SweTraj(msgspec.Struct):
    trajectory: list[_SweStep]
    history: list[_SweMsg]
    info: dict[str, Any] = {}
    environment: str = ""


def parse(data: Any, p: Path, limit: int | None) -> list[Recording]:
    """The one run of a SWE-agent trajectory (``limit`` does not apply: one run per file).

    Raises:
        TrajectoryFormatError: the document does not match the format's schema.
    """
    t = convert(data, _SweTraj, str(p), "a SWE-agent trajectory")
    hist = [m for m in t.history if m.agent == "primary"]
    entries: list[Entry] = []
    prev = ""
    for i, m in enumerate(hist):
        mid, body = f"m{i:04d}", text(m.content)
        if m.role == "assistant":
            entries.append(Turn(mid, body))
        elif m.role == "user" and prev == "assistant" and not m.is_demo:
            entries.append(Obs(mid, "bash", _action(hist[i - 1]), body,
                               call=answer_with_call(entries, "bash", {"command": _action(hist[i - 1])})))
        else:
            kind = ("system" if m.role == "system" else "demo" if m.is_demo
                    else "task" if not has_kind(entries, "task") else "message")
            entries.append(Lit(mid, kind, body))
        prev = m.role
    last = t.trajectory[-1] if t.trajectory else None
    if prev == "assistant" and last is not None and last.response == text(hist[-1].content):
        action = last.action.rstrip("\n")
        entries.append(Obs(f"m{len(hist):04d}", "bash", action, last.observation,
                           call=answer_with_call(entries, "bash", {"command": action})))
    found = _SWEBENCH_ID.search(p.name.removesuffix(".traj"))
    instance = found.group(1) if found else p.stem
    agent = f"SWE-agent ({t.environment})" if t.environment else "SWE-agent"
    src = source(p, "swe-agent", agent, "", instance, str_or_none(t.info.get("exit_status")), None)
    src["trajectory_steps"] = len(t.trajectory)
    return [Recording(name=instance, where=str(p), model="", entries=entries, source=src)]


def _action(m: _SweMsg) -> str:
    return (m.action or "").rstrip("\n")
