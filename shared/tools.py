"""Tool runners for tool steps: recorded, scripted, and real commands.

Each returns the tool's output text or raises :class:`~shared.errors.ToolError`.
"""

from __future__ import annotations

import asyncio
import contextlib

from shared.errors import ToolError
from shared.workflow import ScriptedFailure, ToolSpec

MAX_OUTPUT_BYTES = 8 * 1024 * 1024


async def run_tool(spec: ToolSpec, *, attempt: int, stdin: bytes | None = None) -> str:
    """Run one attempt (1-based) of a tool step; returns its output.

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
    return await _run_command(spec, stdin)


async def _run_command(spec: ToolSpec, stdin: bytes | None) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            *spec.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        raise ToolError(f"cannot run {spec.argv[0]!r}: {exc.strerror}", kind="spawn_failed", retryable=False) from exc
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin or b""), spec.timeout_s)
    except TimeoutError as exc:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise ToolError(f"{spec.argv[0]} timed out after {spec.timeout_s}s", kind="timeout") from exc
    text = out[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace")
    if proc.returncode != 0:
        raise ToolError(f"{spec.argv[0]} exited {proc.returncode}: {text[-500:]}", kind=f"exit_{proc.returncode}")
    return text
