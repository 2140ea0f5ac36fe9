"""The common loader: read a trajectory file, detect its format, parse it, build one workflow per run.

:func:`load_trajectories` is the entry point (re-exported as
``reel.shared.core.trajectories.load_trajectories``). Pure: no NATS, no clock; the
only I/O is reading the file and, for mini-swe-agent, its companion SWE-bench
``report.json``. The format parsers are one module each
(:mod:`~reel.shared.core.trajectories.mini_swe_agent`, :mod:`~reel.shared.core.trajectories.swe_agent`,
:mod:`~reel.shared.core.trajectories.tau_bench`, :mod:`~reel.shared.core.trajectories.openhands`);
:mod:`~reel.shared.core.trajectories.builder` maps their recordings to workflows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

import reel.shared.core.trajectories.mini_swe_agent as mini_swe_agent
import reel.shared.core.trajectories.openhands as openhands
import reel.shared.core.trajectories.swe_agent as swe_agent
import reel.shared.core.trajectories.tau_bench as tau_bench
from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.trajectories.builder import build
from reel.shared.core.trajectories.linear import build_linear
from reel.shared.core.trajectories.recording import Parser
from reel.shared.core.workflow.spec import WorkflowSpec

TrajectoryFormat = Literal["mini-swe-agent", "swe-agent", "tau-bench", "openhands"]
WorkflowForm = Literal["agent", "linear"]
FORMATS: tuple[TrajectoryFormat, ...] = ("mini-swe-agent", "swe-agent", "tau-bench", "openhands")

PARSERS: dict[TrajectoryFormat, Parser] = {
    "mini-swe-agent": mini_swe_agent.parse, "swe-agent": swe_agent.parse, "tau-bench": tau_bench.parse,
    "openhands": openhands.parse,
}
"""Each format's parser (:data:`~reel.shared.core.trajectories.recording.Parser`)."""

_EXPECTED = (
    "expected one of: mini-swe-agent (JSON object with `trajectory_format: \"mini-swe-agent-1\"` and `messages`), "
    "SWE-agent `.traj` (JSON object with `trajectory` and `history` lists), "
    "tau-bench (JSON list of episodes with `traj` and `reward`), "
    "OpenHands (JSONL, one record per line with `instance_id` and `history`)"
)


def detect_format(data: Any) -> TrajectoryFormat:
    """The trajectory format of already-decoded JSON (a JSONL file decodes to a list of records).

    Args:
        data: the decoded document: a dict (mini-swe-agent, SWE-agent, a one-line
            OpenHands file) or a list (tau-bench episodes, OpenHands JSONL records).

    Returns:
        One of :data:`FORMATS`.

    Raises:
        TrajectoryFormatError: unknown shape; the message says what was found and what is expected.
    """
    if isinstance(data, dict):
        tf = data.get("trajectory_format")
        info = data.get("info")
        if (isinstance(tf, str) and tf.startswith("mini-swe-agent")) or (
            "messages" in data and isinstance(info, dict) and "mini_version" in info
        ):
            return "mini-swe-agent"
        if isinstance(data.get("trajectory"), list) and isinstance(data.get("history"), list):
            return "swe-agent"
        if isinstance(data.get("history"), list) and "instance_id" in data:
            return "openhands"
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        if all(isinstance(x.get("traj"), list) for x in data):
            return "tau-bench"
        if all(isinstance(x.get("history"), list) and "instance_id" in x for x in data):
            return "openhands"
    raise TrajectoryFormatError(f"unknown trajectory format: found {_shape(data)}; {_EXPECTED}")


def load_trajectories(
    path: str | Path, *, budget_tokens: int = 8000, limit: int | None = None, form: WorkflowForm = "agent"
) -> list[WorkflowSpec]:
    """Turn a recorded trajectory file into replayable workflows, one per recorded run.

    Args:
        path: a mini-swe-agent ``*.traj.json``, a SWE-agent ``*.traj``, a tau-bench
            episode list (``*.json``) or an OpenHands ``output.jsonl``; the format is detected.
        budget_tokens: context budget of every model step (tokens); the per-item cap
            is a quarter of it, but never below the largest system/task item.
        limit: keep only the first ``limit`` runs of a multi-run file (None = all).
        form: ``agent`` (what ``reel replay`` runs: one agent step replaying the turns through
            the agent loop, :mod:`~reel.shared.core.trajectories.builder`) or ``linear`` (one model
            step per turn and one tool step per result, :mod:`~reel.shared.core.trajectories.linear`;
            for analyses that pack turns as model steps, e.g. the crucible example's judge).

    Returns:
        Validated workflows in file order. ``name`` is the instance id (tau-bench:
        ``<file stem>-task<id>-trial<n>``); ``source`` holds ``file``, ``format``,
        ``agent``, ``model``, ``instance_id``, ``exit_status`` and ``outcome``
        (bool, or None when the file has no label). With a label, a
        ``recorded_outcome`` verifier expects it.

    Raises:
        TrajectoryFormatError: unreadable file, invalid JSON/JSONL, unknown format, a
            recording that does not match its format's schema, a run with no model
            turns, or a workflow over
            :data:`~reel.shared.core.trajectories.builder.MAX_WORKFLOW_BYTES`. The message names the file.
        ValueError: ``budget_tokens < 1``, ``limit < 0`` or an unknown ``form``.
    """
    if budget_tokens < 1:
        raise ValueError("budget_tokens must be >= 1")
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    if form not in ("agent", "linear"):
        raise ValueError(f"form must be 'agent' or 'linear', got {form!r}")
    p = Path(path)
    data = _read(p)
    try:
        fmt = detect_format(data)
    except TrajectoryFormatError as exc:
        raise TrajectoryFormatError(f"{p}: {exc.message}") from None
    recordings = PARSERS[fmt](data, p, limit)
    make = build if form == "agent" else build_linear
    return [make(r, budget_tokens, DEFAULT_COUNTER) for r in recordings]


def _read(p: Path) -> Any:
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise TrajectoryFormatError(f"cannot read trajectory {p}: {exc.strerror or exc}") from None
    if not raw.strip():
        raise TrajectoryFormatError(f"{p}: empty file; {_EXPECTED}")
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        whole = str(exc)
    lines = [ln for ln in raw.splitlines() if ln.strip()]
    if len(lines) > 1:
        records = []
        for line in lines:
            try:
                records.append(msgspec.json.decode(line))
            except msgspec.DecodeError:
                break
        else:
            return records
    raise TrajectoryFormatError(f"{p}: not JSON or JSON Lines ({whole}); {_EXPECTED}")


def _shape(data: Any) -> str:
    if isinstance(data, dict):
        keys = ", ".join(list(map(str, data))[:8]) or "none"
        return f"a JSON object with keys {keys}"
    if isinstance(data, list):
        first = f"; first item: {_shape(data[0])}" if data else ""
        return f"a JSON list of {len(data)} items{first}"
    return f"a JSON {type(data).__name__}"
