"""Rendezvous for the cancel tests (test_cancel_in_flight.py) and bench/cancel_latency.py: tools that block until
they are stopped, and ways to see, through the OS, that the work is gone.

* :class:`Gate` — a python tool (``tests.integration.cancel_support:wait_forever`` async, ``block_sync`` sync)
  registered under a token it gets as its argument: ``started`` when it runs, ``stopped`` when its task was
  cancelled (async), ``finished`` when a blocked thread returned after ``release`` (sync).
* :func:`fifo_rendezvous` — a command tool writes its pids into a FIFO; opening it blocks until the tool does.
* :func:`exited` — the moment a process is gone, from a pidfd (Linux), no polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from pathlib import Path

_GATES: dict[str, Gate] = {}


class Gate:
    """The test's side of one blocking python tool call (armed before the run starts)."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.loop = asyncio.get_running_loop()
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.stopped_at = 0.0
        self.finished = asyncio.Event()
        self.release = threading.Event()
        _GATES[self.token] = self


def arm() -> Gate:
    """A fresh gate (its ``token`` is the tool call's argument)."""
    return Gate()


async def wait_forever(token: str) -> str:
    """An async tool that awaits an event nobody sets; reports its start and its cancellation."""
    gate = _GATES[token]
    gate.started.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        gate.stopped_at = time.monotonic()
        gate.stopped.set()
        raise
    return "never"


def block_sync(token: str) -> str:
    """A sync tool (a worker thread) blocked until the test releases it; then returns a late result."""
    gate = _GATES[token]
    gate.loop.call_soon_threadsafe(gate.started.set)
    gate.release.wait(60)
    gate.loop.call_soon_threadsafe(gate.finished.set)
    return f"late result {token}"


def fifo(folder: Path) -> Path:
    """A fresh FIFO in ``folder``."""
    path = folder / f"pids-{uuid.uuid4().hex[:8]}"
    os.mkfifo(path)
    return path


async def fifo_rendezvous(path: Path, timeout_s: float = 30.0) -> list[int]:
    """The pids a command wrote into the FIFO ``path`` (opening it blocks until the command opens it to write)."""
    def read() -> str:
        with open(path) as f:
            return f.read()

    def unblock() -> None:
        with contextlib.suppress(OSError), open(path, "w"):
            pass
    try:
        text = await asyncio.wait_for(asyncio.to_thread(read), timeout_s)
    except TimeoutError:
        await asyncio.to_thread(unblock)  # the reader thread returns
        raise AssertionError(f"the command never wrote its pids to {path}") from None
    return [int(p) for p in text.split()]


async def exited(pid: int) -> float:
    """Wait until process ``pid`` has exited (a pidfd becomes readable); the monotonic time it was seen."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return time.monotonic()
    loop = asyncio.get_running_loop()
    gone = loop.create_future()
    loop.add_reader(fd, lambda: gone.done() or gone.set_result(time.monotonic()))
    try:
        return await gone
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running: ``kill(-pgid, 0)``, then ``/proc`` — a killed member
    left as a zombie until its new parent reaps it (an orphan goes to PID 1, which may reap late) does not run."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    try:
        entries = [e for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return True  # no /proc: the group exists, zombies or not
    for entry in entries:
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp …, after the command name
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


async def group_gone(pgid: int, timeout_s: float = 5.0) -> None:
    """Until no process of ``pgid`` runs any more (checked with the OS, :func:`group_alive`).

    Raises:
        AssertionError: still running after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process group {pgid} still alive {timeout_s} s after the cancel")
        await asyncio.sleep(0.01)


def sleeper_argv(pids: Path, seconds: int = 20) -> list[str]:
    """A command that puts a background ``sleep`` in its group, writes both pids to ``pids``, then sleeps."""
    return ["sh", "-c", f'sleep {seconds} & echo $$ $! > "{pids}"; wait']
