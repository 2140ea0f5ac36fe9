"""The one way Reel runs a command: in its own process group, killed whole on every way out.

:func:`run_group` starts ``argv`` as the leader of a new session (its pgid is its
pid). The child dies with this process and is recorded for the reaper
(:mod:`reel.shared.proc.reaper`). Whatever ends the call, the whole group is
SIGKILLed before it returns or raises:

* **normal exit** — the leader has exited and its output pipes are closed: the
  group is killed, so background children it left behind do not outlive it;
* **timeout** — the group is killed, the output so far kept, ``timed_out`` set;
* **cancellation** of the awaiting task, or **any exception** — the group is
  killed, then the exception propagates.

In a process that is a child subreaper (:mod:`reel.shared.proc.subreaper`) every command carries a
mark in its environment, and what carries it outside the group (a ``setsid`` daemon) is killed and
reaped with the group.

With ``term_grace_s`` the group first gets SIGTERM and that long to exit (a
service draining its work) before the SIGKILL. Output is read as it comes:
each captured stream keeps at most ``output_limit_bytes`` (the first or the
last, ``keep``), so a chatty child never grows this process beyond the limit;
with ``stdout_sink`` every stdout chunk is handed to it as read instead (a tool's
spool: :mod:`reel.shared.proc.tools`) and none is kept here.

Callers map :class:`Completed` to their own results: tools
(:mod:`reel.shared.proc.tools`), the command verifier (:mod:`reel.shared.proc.verifier`),
Crucible's judge, proposer, probes and git (``services/crucible/proc.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import os
import signal as signals
import subprocess
import time
from collections.abc import AsyncIterable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from reel.shared.proc import ledger, reaper, subreaper

Keep = Literal["head", "tail"]
Stdin = bytes | AsyncIterable[bytes] | BinaryIO | None
Stream = Literal["stdout", "stderr"]

DEFAULT_OUTPUT_LIMIT_BYTES = 8 * 1024 * 1024
DRAIN_AFTER_KILL_S = 2.0
"""After the kill, how long the output pipes may stay open (held by a process that left the group)."""
_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Completed:
    """How a group's leader ended, what it printed, how long it ran.

    Attributes:
        argv: the command as run.
        exit_code: its exit status, or ``None`` if a signal ended it.
        signal: the signal that ended it (SIGKILL after a timeout), or ``None`` if it exited.
        timed_out: ``timeout_s`` passed before it finished; the group was killed.
        stdout: its standard output (with ``merge_stderr``, its standard error too), cut to the limit.
        stderr: its standard error (empty with ``merge_stderr`` or ``capture=False``), cut to the limit.
        stdout_truncated: stdout was longer than the limit (``stdout`` holds its head or tail).
        stderr_truncated: the same for stderr.
        duration_ms: wall time from the spawn to the group's end (ms).
    """

    argv: tuple[str, ...]
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int

    @property
    def returncode(self) -> int:
        """asyncio's convention: the exit status, or minus the signal number."""
        return self.exit_code if self.exit_code is not None else -(self.signal or 0)

    @property
    def truncated(self) -> bool:
        """Either stream was cut to the limit."""
        return self.stdout_truncated or self.stderr_truncated

    def text(self, stream: Stream = "stdout") -> str:
        """A stream decoded as UTF-8 (undecodable bytes replaced)."""
        return (self.stdout if stream == "stdout" else self.stderr).decode("utf-8", errors="replace")

    def last_line(self, stream: Stream = "stdout", limit_chars: int = 300) -> str:
        """The last non-empty line of a stream, stripped and cut to ``limit_chars``."""
        lines = [ln.strip() for ln in self.text(stream).splitlines() if ln.strip()]
        return lines[-1][:limit_chars] if lines else ""


class _Kept:
    """One output stream as it arrives: its first or last ``limit`` bytes, and how many came."""

    def __init__(self, limit: int, keep: Keep, sink: Callable[[bytes], object] | None = None) -> None:
        self.limit, self.tail, self.sink = limit, keep == "tail", sink
        self.seen = 0
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.sink is not None:
            self.sink(chunk)
        elif self.tail:
            self._buf += chunk
            if len(self._buf) > 2 * self.limit + _CHUNK_BYTES:  # trim now and then, not on every chunk
                del self._buf[: len(self._buf) - self.limit]
        elif len(self._buf) < self.limit:
            self._buf += chunk[: self.limit - len(self._buf)]

    @property
    def truncated(self) -> bool:
        return self.seen > self.limit

    def value(self) -> bytes:
        return bytes(self._buf[max(0, len(self._buf) - self.limit):] if self.tail else self._buf)


_GROUPS: contextvars.ContextVar[tuple[set[int], ...]] = contextvars.ContextVar("reel_tool_groups", default=())
"""The process groups alive under each enclosing :func:`tracked_groups` scope, outermost first (inherited by the
tasks a scope starts)."""


@contextlib.contextmanager
def tracked_groups() -> Iterator[set[int]]:
    """A scope whose :func:`run_group` children are tracked: yields the live set of their pgids (a group is in it
    from its spawn until it has been reaped), for :func:`kill_groups`. Tasks created inside inherit the scope.
    Scopes nest: a group is in the set of every scope it was started under (an executor incarnation's, and the
    drive's of the one run it is a tool of)."""
    groups: set[int] = set()
    token = _GROUPS.set((*_GROUPS.get(), groups))
    try:
        yield groups
    finally:
        _GROUPS.reset(token)


def kill_groups(groups: set[int]) -> int:
    """SIGKILL every process group in ``groups`` now (synchronous; a group already gone is skipped); how many."""
    for pgid in list(groups):
        _signal_group(pgid, signals.SIGKILL)
    return len(groups)


async def run_group(
    argv: Sequence[str], *, timeout_s: float | None, cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None, stdin: Stdin = None,
    output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT_BYTES, keep: Keep = "head", merge_stderr: bool = False,
    capture: bool = True, term_grace_s: float = 0.0, stdout_sink: Callable[[bytes], object] | None = None,
) -> Completed:
    """Run ``argv`` in a new process group; the group is killed on every way out (see module doc).

    Args:
        argv: the program and its arguments (``argv[0]`` looked up in ``PATH``).
        timeout_s: seconds from the spawn until the group is killed (``None``: no deadline).
            The leader must have exited *and* closed its output pipes within it.
        cwd: working directory (default: this process's).
        env: exactly the child's environment (default: this process's).
        stdin: bytes written to its standard input, then closed; an open file: the child's stdin itself
            (it reads the file from its current position; nothing passes through this process); an async
            iterable of chunks (a blob
            streamed from the store): each written as it comes, with backpressure (the next is asked for
            once the pipe drained), then closed — if the child stops reading, the rest is still consumed
            (and dropped), so a source that checks what it yields (a blob's sha256) still gets to the end;
            an error the source raises kills the group at once, before its stdin is closed, and
            propagates; ``None``: ``/dev/null``.
        output_limit_bytes: at most this much kept per captured stream (the rest is read and dropped).
        keep: ``"head"`` keeps the first ``output_limit_bytes``, ``"tail"`` the last.
        merge_stderr: standard error goes to the stdout pipe (interleaved as written).
        capture: ``False`` leaves stdout/stderr as this process's own (nothing is kept).
        term_grace_s: when the group must die before the leader has exited (timeout, cancellation,
            error), it first gets SIGTERM and this long to exit; then SIGKILL. 0: SIGKILL at once.
        stdout_sink: called with every stdout chunk (≤ 64 KiB) as it is read; then ``Completed.stdout``
            is empty and ``stdout_truncated`` says whether more than ``output_limit_bytes`` came.

    Returns:
        The :class:`Completed` leader (a timeout is a result, not an error).

    Raises:
        OSError: the program cannot be started (``FileNotFoundError``, ``PermissionError``, …).
        asyncio.CancelledError: the awaiting task was cancelled (the group was killed first).
    """
    if output_limit_bytes < 0 or keep not in ("head", "tail"):
        raise ValueError(f"bad output limit {output_limit_bytes!r} / keep {keep!r}")
    records = reaper.registry()
    if records is not None:
        records.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    mark = subreaper.new_mark() if subreaper.is_subreaper() else None
    proc = await _started(_spawn(argv, cwd=cwd, env=_marked(ledger.child_env(env), mark), stdin=stdin,
                                 merge_stderr=merge_stderr, capture=capture, records=records), records)
    live = _GROUPS.get()
    for scope in live:
        scope.add(proc.pid)
    out, err = _Kept(output_limit_bytes, keep, stdout_sink), _Kept(output_limit_bytes, keep)
    pumps: list[asyncio.Future[Any]] = [asyncio.ensure_future(c) for c in (
        _write(proc.stdin, stdin), _read(proc.stdout, out), _read(proc.stderr, err), proc.wait())]
    try:  # a failing pump (its stdin's source) ends the wait at once: the group is killed below
        ledger.record_process(env, proc.pid)  # reel chaos counts side effects (off unless this process's env says)
        _, pending = await asyncio.wait(pumps, timeout=timeout_s, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        sweep = _Sweep(mark, proc.pid)
        try:
            await _end(proc, pumps, term_grace_s, sweep)
        finally:
            sweep()  # again, whatever interrupted _end
            reaper.forget(records, proc.pid)
            for scope in live:
                scope.discard(proc.pid)
    failure = next((e for p in pumps if p.done() and not p.cancelled() and (e := p.exception())), None)
    if failure is not None:
        raise failure
    rc = proc.returncode
    assert rc is not None  # _end waited for the leader
    return Completed(
        argv=tuple(argv), exit_code=rc if rc >= 0 else None, signal=-rc if rc < 0 else None,
        timed_out=bool(pending), stdout=out.value(), stderr=err.value(),
        stdout_truncated=out.truncated, stderr_truncated=err.truncated,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def _marked(env: Mapping[str, str] | None, mark: str | None) -> Mapping[str, str] | None:
    """``env`` with the command's :data:`~reel.shared.proc.subreaper.MARK_ENV` (none: ``env`` as it is)."""
    if mark is None:
        return env
    return {**(os.environ if env is None else env), subreaper.MARK_ENV: mark}


class _Sweep:
    """Kills what a command left outside its group (:func:`~reel.shared.proc.subreaper.kill_escaped`), each
    time it is called once the group was killed; nothing when this process is no subreaper."""

    def __init__(self, mark: str | None, pgid: int) -> None:
        self.mark, self.pgid = mark, pgid

    def __call__(self) -> None:
        if self.mark is not None:
            subreaper.kill_escaped(self.mark, self.pgid, leader=self.pgid)


async def _started(spawning: Coroutine[Any, Any, asyncio.subprocess.Process],
                   records: Path | None) -> asyncio.subprocess.Process:
    """The spawned process; cancelled while spawning (the child may already run), its group is
    killed as soon as the spawn completes (asyncio's own cleanup would kill the leader only, then
    wait for pipes its children may hold)."""
    spawn = asyncio.ensure_future(spawning)
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        spawn.add_done_callback(functools.partial(_kill_spawned, records))
        raise


def _kill_spawned(records: Path | None, spawn: asyncio.Future[asyncio.subprocess.Process]) -> None:
    if not spawn.cancelled() and spawn.exception() is None:
        pgid = spawn.result().pid
        _signal_group(pgid, signals.SIGKILL)
        reaper.forget(records, pgid)


async def _spawn(argv: Sequence[str], *, cwd: str | Path | None, env: Mapping[str, str] | None, stdin: Stdin,
                 merge_stderr: bool, capture: bool, records: Path | None) -> asyncio.subprocess.Process:
    pipe = asyncio.subprocess.PIPE
    try:
        return await asyncio.create_subprocess_exec(
            *argv, cwd=None if cwd is None else str(cwd), env=None if env is None else dict(env),
            stdin=asyncio.subprocess.DEVNULL if stdin is None else pipe if isinstance(stdin, bytes | AsyncIterable)
            else stdin,
            stdout=pipe if capture else None,
            stderr=(asyncio.subprocess.STDOUT if merge_stderr else pipe) if capture else None,
            start_new_session=True, preexec_fn=functools.partial(reaper.child_setup, os.getpid(), records),
        )
    except subprocess.SubprocessError as exc:  # child_setup raised in the child (its record not writable)
        raise OSError(errno.EIO, f"process setup failed ({reaper.REGISTRY_ENV}={records}): {exc}") from exc


async def _write(pipe: asyncio.StreamWriter | None, data: Stdin) -> None:
    if pipe is None:  # no stdin, or a file the child reads itself
        return
    if isinstance(data, AsyncIterable):
        reading = True
        async for chunk in data:  # a raise leaves the pipe open: the group dies before it could see an EOF
            if reading:
                try:
                    pipe.write(chunk)
                    await pipe.drain()
                except (BrokenPipeError, ConnectionResetError):  # the child stopped reading: consume the rest
                    reading = False
        pipe.close()
        return
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the child need not read it all
            pipe.write(data if isinstance(data, bytes) else b"")
            await pipe.drain()
    finally:
        pipe.close()


async def _read(stream: asyncio.StreamReader | None, into: _Kept) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_CHUNK_BYTES):
        into.feed(chunk)


def _signal_group(pgid: int, sig: signals.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _end(proc: asyncio.subprocess.Process, pumps: list[asyncio.Future[Any]], term_grace_s: float,
               sweep: Callable[[], None]) -> None:
    """Kill the group (SIGTERM and a grace first if asked and the leader runs), reap the leader, kill what
    left the group (``sweep``), give the pipes :data:`DRAIN_AFTER_KILL_S` to close, then drop whatever still
    reads."""
    killed = False
    try:
        if proc.returncode is None and term_grace_s > 0:
            _signal_group(proc.pid, signals.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pumps[-1]), term_grace_s)
        _signal_group(proc.pid, signals.SIGKILL)
        killed = True
        sweep()  # before the wait: an escaped process holding the output pipes would hold up the leader's wait
        await asyncio.shield(pumps[-1])
        sweep()  # the group's zombies, the leader reaped
        await asyncio.wait(pumps, timeout=DRAIN_AFTER_KILL_S)
    finally:  # cancelled again while cleaning up: the group dies all the same
        if not killed:
            _signal_group(proc.pid, signals.SIGKILL)
        held = any(not p.done() for p in pumps[:3])
        for p in pumps:
            p.cancel()
        transport = getattr(proc, "_transport", None)
        if held and transport is not None:  # pipes still open, held by a process that left the group
            transport.close()
