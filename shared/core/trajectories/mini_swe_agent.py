"""mini-swe-agent ``*.traj.json`` → :class:`~reel.shared.core.trajectories.recording.Recording` (one run per file).

Assistant messages are model turns; a user message answering one is the
observation of its bash command (the single fenced ``bash`` block of the turn), which
becomes the turn's call of a ``bash`` tool (``{"command": …}``; ``{}`` for a format error);
the rest are literals (``system``, the first user message as ``task``, then
``message``). The outcome label comes from a SWE-bench harness report beside the
file, if there is one (:func:`swebench_label`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.trajectories.recording import (
    Entry,
    Lit,
    Msg,
    Obs,
    Recording,
    Turn,
    answer_with_call,
    convert,
    dig,
    has_kind,
    response,
    source,
    str_or_none,
    text,
    usage,
)

_BASH = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)


class _MiniTraj(msgspec.Struct):
    messages: list[Msg]
    trajectory_format: str = ""
    instance_id: str | None = None
    info: dict[str, Any] = {}


def parse(data: Any, p: Path, limit: int | None) -> list[Recording]:
    """The one run of a mini-swe-agent trajectory (``limit`` does not apply: one run per file).

    Raises:
        TrajectoryFormatError: the document does not match the format's schema, or its report is unreadable.
    """
    t = convert(data, _MiniTraj, str(p), "a mini-swe-agent trajectory")
    instance = t.instance_id or p.name.removesuffix(".json").removesuffix(".traj")
    model = str_or_none(dig(t.info, "config", "model", "model_name")) or ""
    entries: list[Entry] = []
    prev = ""
    for i, m in enumerate(t.messages):
        mid, body = f"m{i:04d}", text(m.content)
        if m.role == "assistant":
            resp = response(m.extra.get("response"))
            model = model or (resp.model if resp else "")
            entries.append(Turn(mid, body, usage(resp)))
        elif m.role == "user" and prev == "assistant":
            cmds = _BASH.findall(entries[-1].output if isinstance(entries[-1], Turn) else "")
            cmd = cmds[0].strip() if len(cmds) == 1 else ""
            call = answer_with_call(entries, "bash", {"command": cmd} if cmd else {})
            entries.append(Obs(mid, "bash", cmd, body, call=call))
        else:
            kind = m.role if m.role == "system" else "task" if not has_kind(entries, "task") else "message"
            entries.append(Lit(mid, kind, body))
        prev = m.role
    outcome, label_file = swebench_label(p, instance)
    version = str_or_none(t.info.get("mini_version"))
    src = source(p, "mini-swe-agent", f"mini-swe-agent {version}" if version else "mini-swe-agent", model,
                 instance, str_or_none(t.info.get("exit_status")), outcome)
    if label_file:
        src["outcome_from"] = label_file
    return [Recording(name=instance, where=str(p), model=model, entries=entries, source=src, outcome=outcome)]


def swebench_label(p: Path, instance: str) -> tuple[bool | None, str | None]:
    """``resolved`` from a SWE-bench harness report beside the trajectory, if there is one.

    Looked for: ``<x>.report.json`` for ``<x>.traj.json``, ``<instance>.report.json``,
    ``report.json`` in the same folder, and the harness layout ``../../logs/<instance>/report.json``.
    A report is flat (``{resolved, …}``, only accepted from the first two names) or keyed by instance id.

    Returns:
        ``(resolved, report path)``, or ``(None, None)`` when no report labels the instance.

    Raises:
        TrajectoryFormatError: a report exists but is unreadable or not JSON.
    """
    named = [p.with_name(p.name.removesuffix(".traj.json") + ".report.json"), p.with_name(f"{instance}.report.json")]
    shared = [p.with_name("report.json"), p.parent.parent.parent / "logs" / instance / "report.json"]
    for cand in dict.fromkeys([*named, *shared]):
        if cand == p or not cand.is_file():
            continue
        try:
            report = msgspec.json.decode(cand.read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            raise TrajectoryFormatError(f"{cand}: unreadable SWE-bench report beside {p.name}: {exc}") from None
        resolved = dig(report, instance, "resolved")
        if resolved is None and cand in named:
            resolved = dig(report, "resolved")
        if isinstance(resolved, bool):
            return resolved, str(cand)
    return None, None
