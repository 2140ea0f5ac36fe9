"""The side-effect ledger: one JSON line per start of a tool's side effect, for ``reel chaos`` (docs/chaos.md).

Off unless ``$REEL_SIDE_EFFECT_LEDGER`` names a file in the executor's own environment (``reel chaos``
sets it for the executors it starts, and only for them). Then:

* :func:`~reel.shared.proc.group.run_group` appends ``{"kind": "process", "pid": …}`` once a command's process
  has started (``exec`` succeeded) whose environment names an attempt (``REEL_RUN_ID``, ``REEL_STEP_ID``,
  ``REEL_ATTEMPT``: a tool step's or an agent tool call's command; a verifier's has none);
* an agent's Python tool appends ``{"kind": "python"}`` as it is called (it has no process of its own).

Each line is one ``write(2)`` on a file opened ``O_APPEND``, under ``PIPE_BUF`` bytes: lines from
several executors never interleave. Each carries the attempt (run, branch, step, attempt, tool name).
The variable is removed from a tool's environment: a tool never learns the ledger's path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from reel.shared.core.run.crashpoints import SideEffect

LEDGER_ENV = "REEL_SIDE_EFFECT_LEDGER"
_MAX_LINE_BYTES = 4000
_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(SideEffect)


def enabled() -> bool:
    """Whether this process records side effects (``$REEL_SIDE_EFFECT_LEDGER`` is set)."""
    return bool(os.environ.get(LEDGER_ENV))


def record(effect: SideEffect) -> None:
    """Append ``effect`` to the ledger if it is on (one atomic append; an unwritable ledger raises OSError)."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    line = _enc.encode(effect)[:_MAX_LINE_BYTES] + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


ATTEMPT_VARS = ("REEL_RUN_ID", "REEL_BRANCH_ID", "REEL_STEP_ID", "REEL_ATTEMPT", "REEL_TOOL_NAME")
"""What the executor sets in a tool's environment to name its attempt (read back from that mapping here)."""


def record_process(env: Mapping[str, str] | None, pid: int) -> None:
    """Record a started process (``pid``) whose environment ``env`` names an attempt; anything else is skipped."""
    if not enabled() or env is None:
        return
    run_id, branch_id, step_id, attempt, tool = (env.get(name, "") for name in ATTEMPT_VARS)
    if run_id and step_id:
        record(SideEffect(kind="process", run_id=run_id, branch_id=branch_id, step_id=step_id,
                          attempt=int(attempt) if attempt.isdigit() else 0, tool=tool, pid=pid))


def child_env(env: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``env`` without :data:`LEDGER_ENV` (``None``: this process's environment, without it when it is set)."""
    if env is None:
        return {k: v for k, v in os.environ.items() if k != LEDGER_ENV} if enabled() else None
    return {k: v for k, v in env.items() if k != LEDGER_ENV} if LEDGER_ENV in env else env


def read(path: Path) -> list[SideEffect]:
    """Every entry of the ledger at ``path`` (a missing file: none; a torn last line is skipped)."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(_dec.decode(line))
        except msgspec.DecodeError:
            continue
    return out
