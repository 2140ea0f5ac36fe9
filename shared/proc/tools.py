"""Tool runners for tool steps: recorded, scripted, and real commands.

Each returns the tool's output text or raises :class:`~shared.core.errors.ToolError`.
A command runs on :func:`~shared.proc.group.run_group`: its own process group,
killed as a whole when it exits (background children included), on timeout or
when the attempt is cancelled. If the executor process dies (kill -9), Linux's
parent-death signal kills the tool's direct child, and the next executor started
on the host kills the rest of the group (:func:`reap_orphaned_tools`, i.e.
:func:`shared.proc.orphans.reap_orphans`).
Tool steps run at least once per attempt: a step that must not repeat a side
effect should be idempotent (e.g. keyed by ``REEL_RUN_ID``/``REEL_STEP_ID``).
"""

from __future__ import annotations

import os

from shared.core.errors import ToolError
from shared.core.workflow import ScriptedFailure, ToolSpec
from shared.proc.group import run_group
from shared.proc.orphans import reap_orphans as reap_orphaned_tools

__all__ = ["MAX_OUTPUT_BYTES", "reap_orphaned_tools", "run_tool"]

MAX_OUTPUT_BYTES = 8 * 1024 * 1024


async def run_tool(spec: ToolSpec, *, attempt: int, stdin: bytes | None = None,
                   env: dict[str, str] | None = None) -> str:
    """Run one attempt (1-based) of a tool step; returns its output.

    ``env`` is added to a command's environment (the executor passes
    ``REEL_RUN_ID``, ``REEL_BRANCH_ID``, ``REEL_STEP_ID``, ``REEL_ATTEMPT``).

    Raises:
        ToolError: scripted failure (its kind), ``exit_<code>`` for a command that
            exited non-zero, ``timeout`` past ``spec.timeout_s``, ``spawn_failed``.
    """
    if spec.type == "recorded":
        return spec.output or ""
    if spec.type == "scripted":
        entry = spec.outputs[min(attempt, len(spec.outputs)) - 1]
        if isinstance(entry, ScriptedFailure):
            raise ToolError(entry.message or entry.error, kind=entry.error, retryable=entry.retryable)
        return entry
    return await _run_command(spec, stdin, env)


async def _run_command(spec: ToolSpec, stdin: bytes | None, env: dict[str, str] | None) -> str:
    """Run ``spec.argv`` (stderr merged into stdout, the first 8 MiB kept) on :func:`run_group`."""
    try:
        done = await run_group(spec.argv, timeout_s=spec.timeout_s, env={**os.environ, **env} if env else None,
                               stdin=stdin or b"", output_limit_bytes=MAX_OUTPUT_BYTES, keep="head",
                               merge_stderr=True)
    except OSError as exc:
        raise ToolError(f"cannot run {spec.argv[0]!r}: {exc.strerror}", kind="spawn_failed", retryable=False) from exc
    if done.timed_out:
        raise ToolError(f"{spec.argv[0]} timed out after {spec.timeout_s}s", kind="timeout")
    text = done.text()
    if done.returncode != 0:
        raise ToolError(f"{spec.argv[0]} exited {done.returncode}: {text[-500:]}", kind=f"exit_{done.returncode}")
    return text
