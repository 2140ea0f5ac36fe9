"""Crucible's processes (judge, proposer, park probe, git) on the one runner, :func:`reel.shared.proc.group.run_group`.

Each runs in its own process group, which dies with the driver and is killed
whole when the command exits (a judge that forks a worker cannot outlive its
reading), at its timeout, or when the driver's task is cancelled. Crucible keeps
the last MiB of stdout and of stderr (the verdicts read last lines).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from reel.shared.core.env.toolenv import BASE_ENV_KEYS, tool_env
from reel.shared.proc.group import Completed, run_group

__all__ = ["BASE_ENV_KEYS", "EX_TEMPFAIL", "OUTPUT_LIMIT_BYTES", "Completed", "base_env", "resolve_argv", "run"]

EX_TEMPFAIL = 75
"""sysexits.h "temporary failure": the resource is unavailable, try later (provisioning, park)."""

OUTPUT_LIMIT_BYTES = 1 << 20


def resolve_argv(argv: Sequence[str]) -> list[str]:
    """``{python}`` → this interpreter (so configs need not hard-code a venv path)."""
    return [sys.executable if a == "{python}" else a for a in argv]


async def run(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout_s: float,
              stdin: bytes | None = None) -> Completed:
    """Run ``argv`` (``{python}`` resolved) in ``cwd`` with exactly ``env``; the tail of each stream kept.

    A timeout is a result (``timed_out``), not an error.

    Raises:
        OSError: the program cannot be started (``FileNotFoundError``, ``PermissionError``…).
    """
    return await run_group(resolve_argv(argv), cwd=cwd, env=env, stdin=stdin, timeout_s=timeout_s,
                           output_limit_bytes=OUTPUT_LIMIT_BYTES, keep="tail")


def base_env(pass_env: Sequence[str] = ()) -> dict[str, str]:
    """The minimal inherited environment of a judge, proposer or probe, and the ``pass_env`` names it lists
    (:func:`reel.shared.core.env.toolenv.tool_env`: everything else must be declared; ``REEL_NATS_*`` never crosses)."""
    return tool_env(os.environ, pass_env=pass_env)
