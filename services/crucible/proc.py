"""Running a child command with a deadline: the one place Crucible starts processes.

The child gets its own process group, so a timeout (or our own cancellation)
kills it and everything it started — a judge that forks a worker cannot outlive
its reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

EX_TEMPFAIL = 75
"""sysexits.h "temporary failure": the resource is unavailable, try later (provisioning, park)."""

OUTPUT_LIMIT_BYTES = 1 << 20


@dataclass(frozen=True)
class Completed:
    """A finished (or killed) child: exit code (``None`` if timed out), outputs, wall time (ms)."""

    returncode: int | None
    stdout: str
    stderr: str
    wall_ms: int

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def last_line(self, stream: str = "stdout") -> str:
        """The last non-empty line of ``stdout`` or ``stderr`` (stripped, ≤ 300 chars)."""
        text = self.stdout if stream == "stdout" else self.stderr
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""


def resolve_argv(argv: Sequence[str]) -> list[str]:
    """``{python}`` → this interpreter (so configs need not hard-code a venv path)."""
    return [sys.executable if a == "{python}" else a for a in argv]


async def run(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout_s: float,
              stdin: bytes | None = None) -> Completed:
    """Run ``argv`` in ``cwd`` with exactly ``env``; kill its process group after ``timeout_s``.

    Raises:
        FileNotFoundError / PermissionError: the program cannot be started.
    """
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *resolve_argv(argv), cwd=str(cwd), env=dict(env), start_new_session=True,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
        code: int | None = proc.returncode
    except TimeoutError:
        _kill_group(proc)
        out, err = await proc.communicate()
        code = None
    except BaseException:
        _kill_group(proc)
        with contextlib.suppress(Exception):
            await proc.wait()
        raise
    wall_ms = int((time.perf_counter() - started) * 1000)
    return Completed(returncode=code, stdout=_text(out), stderr=_text(err), wall_ms=wall_ms)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _text(data: bytes | None) -> str:
    return (data or b"")[-OUTPUT_LIMIT_BYTES:].decode("utf-8", errors="replace")


BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")


def base_env() -> dict[str, str]:
    """The minimal inherited environment of a judge or probe (everything else must be declared)."""
    return {k: os.environ[k] for k in BASE_ENV_KEYS if k in os.environ}
