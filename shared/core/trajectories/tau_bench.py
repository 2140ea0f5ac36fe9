"""tau-bench historical trajectories (a JSON list of episodes) → one :class:`Recording` per episode.

Assistant messages are model turns (native tool calls rendered as
``<tool_call>`` lines); a ``tool`` message is the observation of the call it
answers; the simulated user's reply to a text turn is a ``respond`` observation
of kind ``message`` (in the agent form, the result of a ``respond`` call with
arguments ``{}`` made by that turn: the text stays its content). ``reward == 1``
is the outcome label. The model and domain come from the file name
(``<model>-<domain>.json``).
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
    ToolCall,
    Turn,
    answer_with_call,
    args_text,
    convert,
    has_kind,
    native_turn,
    source,
    text,
)

_TAU_DOMAINS = ("airline", "retail")


class _TauEpisode(msgspec.Struct):
    traj: list[Msg]
    reward: float | None = None
    task_id: int | str | None = None
    trial: int | None = None


def parse(data: Any, p: Path, limit: int | None) -> list[Recording]:
    """The file's episodes in order, the first ``limit`` of them if given.

    Raises:
        TrajectoryFormatError: an episode does not match the format's schema (the message names it).
    """
    episodes = data[:limit] if limit is not None else data
    stem = p.stem.removeprefix("taubench_").removeprefix("taubench-")
    domain = next((d for d in _TAU_DOMAINS if stem.endswith(f"-{d}")), None)
    model = stem.removesuffix(f"-{domain}") if domain else ""
    return [_episode(raw, p, i, model, domain) for i, raw in enumerate(episodes)]


def _episode(raw: Any, p: Path, index: int, model: str, domain: str | None) -> Recording:
    where = f"{p} (episode {index})"
    ep = convert(raw, _TauEpisode, where, "a tau-bench episode")
    entries: list[Entry] = []
    calls: dict[str, ToolCall] = {}
    turn_calls: list[ToolCall] = []
    prev: Msg | None = None
    for i, m in enumerate(ep.traj):
        mid, body = f"m{i:04d}", text(m.content)
        if m.role == "assistant":
            turn_calls = m.tool_calls or []
            calls = {c.id: c for c in turn_calls}
            entries.append(native_turn(mid, body, m.tool_calls or []))
        elif m.role == "tool" and any(isinstance(e, Turn) for e in entries):
            c = calls.get(m.tool_call_id or "")
            name = m.name or (c.function.name if c else "tool")
            which = next(j for j, x in enumerate(turn_calls) if x is c) if c else None
            entries.append(Obs(mid, name, args_text(c.function.arguments) if c else "", body, call=which))
        elif m.role == "user" and prev is not None and prev.role == "assistant" and not prev.tool_calls:
            entries.append(Obs(mid, "respond", "", body, kind="message",
                               call=answer_with_call(entries, "respond", {})))
        else:
            kind = ("system" if m.role == "system" else "task" if m.role == "user" and not has_kind(entries, "task")
                    else "observation" if m.role == "tool" else "message")
            entries.append(Lit(mid, kind, body))
        prev = m
    outcome = None if ep.reward is None else abs(ep.reward - 1.0) < 1e-6
    instance = f"task{ep.task_id}-trial{ep.trial}" if ep.task_id is not None else f"episode{index}"
    src = source(p, "tau-bench", "tau-bench tool-calling agent", model, instance, None, outcome)
    src.update(task_id=ep.task_id, trial=ep.trial, reward=ep.reward, domain=domain, episode=index)
    if outcome is not None:
        src["outcome_from"] = "reward"
    return Recording(name=f"{p.stem}-{instance}", where=where, model=model, entries=entries, source=src,
                     outcome=outcome)
