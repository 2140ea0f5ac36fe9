"""Tool runners for tool steps: recorded, scripted, and real commands.

Each returns the tool's output text or raises :class:`~shared.core.errors.ToolError`.
A command runs in its own process group, killed as a whole on timeout or when
the attempt is cancelled. If the executor process dies (kill -9), Linux's
parent-death signal kills the tool's direct child, and the next executor started
on the host kills the rest of the group (:func:`reap_orphaned_tools`).
Tool steps run at least once per attempt: a step that must not repeat a side
effect should be idempotent (e.g. keyed by ``REEL_RUN_ID``/``REEL_STEP_ID``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import sys
from pathlib import Path

from shared.core.errors import ToolError
from shared.core.workflow import ScriptedFailure, ToolSpec

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


TOOL_DIR_ENV = "REEL_TOOL_DIR"


def _registry() -> Path | None:
    d = os.environ.get(TOOL_DIR_ENV)
    return Path(d) if d else None


def _child_setup(registry: Path | None) -> None:  # pragma: no cover - runs in the child between fork and exec
    """In the tool's process, before it runs anything: die with the executor (Linux parent-death
    signal: kill -9 included) and record ``<executor pid>.<pgid>`` in ``$REEL_TOOL_DIR`` — from the
    child itself, so the record exists before the tool can start children of its own."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if registry is not None:
        os.close(os.open(registry / f"{os.getppid()}.{os.getpid()}", os.O_CREAT | os.O_WRONLY, 0o644))


def _group_is_a_tool(pgid: int) -> bool:
    """True if some live process of group ``pgid`` carries a Reel attempt in its environment."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and b"REEL_ATTEMPT=" in (stat.parent / "environ").read_bytes():
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def reap_orphaned_tools() -> int:
    """Kill the tool process groups left by executors of this host that died (kill -9, OOM).

    Linux's parent-death signal reaches only a tool's direct child; its own
    children (``sh -c "…; sleep …"``) would run on beside the attempt that
    replaces it. Every executor records its tools in ``$REEL_TOOL_DIR``; one that
    starts kills the groups whose executor is gone. Returns how many it killed.
    """
    d = _registry()
    if d is None or not d.is_dir():
        return 0
    killed = 0
    for entry in d.iterdir():
        try:
            owner, pgid = (int(x) for x in entry.name.split("."))
        except ValueError:
            continue
        if Path(f"/proc/{owner}").exists():
            continue  # its executor lives: its tool is not an orphan
        if _group_is_a_tool(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
        entry.unlink(missing_ok=True)
    return killed


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _run_command(spec: ToolSpec, stdin: bytes | None, env: dict[str, str] | None) -> str:
    """Run ``spec.argv`` in its own process group; the whole group is killed on timeout or cancellation."""
    registry = _registry()
    if registry is not None:
        registry.mkdir(parents=True, exist_ok=True)
    try:
        proc = await asyncio.create_subprocess_exec(
            *spec.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            preexec_fn=functools.partial(_child_setup, registry),
            env={**os.environ, **env} if env else None,
        )
    except OSError as exc:
        raise ToolError(f"cannot run {spec.argv[0]!r}: {exc.strerror}", kind="spawn_failed", retryable=False) from exc
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin or b""), spec.timeout_s)
    except TimeoutError as exc:
        _kill_group(proc)
        await proc.wait()
        raise ToolError(f"{spec.argv[0]} timed out after {spec.timeout_s}s", kind="timeout") from exc
    except asyncio.CancelledError:
        _kill_group(proc)
        raise
    finally:
        if proc.returncode is not None:
            _kill_group(proc)  # background children the tool left behind
        if registry is not None:  # start_new_session: the tool's pgid is its pid
            (registry / f"{os.getpid()}.{proc.pid}").unlink(missing_ok=True)
    text = out[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace")
    if proc.returncode != 0:
        raise ToolError(f"{spec.argv[0]} exited {proc.returncode}: {text[-500:]}", kind=f"exit_{proc.returncode}")
    return text
