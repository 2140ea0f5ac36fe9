"""Descendants that left their process group: this process stays their ancestor, and kills and reaps them.

Killing a command's process group (:func:`reel.shared.proc.group.run_group`) misses a descendant that
called ``setsid`` (a daemon's double fork: ``setsid sh -c 'sleep 300 &'``): it is in a group and session
of its own, and once its parent exits Linux hands it to init. A process that calls :func:`become_subreaper`
(Linux ``prctl(PR_SET_CHILD_SUBREAPER)``) gets those orphans instead: every process its commands start
stays in its own process tree, whatever group or session it moves to.

So when a command ends, :func:`kill_escaped` walks this process's tree (``/proc/<pid>/task/<tid>/children``)
for the processes that carry the command's mark — :data:`MARK_ENV` in their initial environment, which
every descendant inherits — SIGKILLs them and reaps those that became this process's children. A
descendant that exited on its own after leaving the group and before the walk is reaped with the
group's zombies only if it kept the group id; one that cleared its environment before it left is not
found (a cgroup per command would find it; none is used).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator

MARK_ENV = "REEL_PROC_MARK"
"""The environment variable that marks every process one command started (``<owner pid>.<n>``)."""

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_REAP_WAIT_S = 2.0
_counter = itertools.count(1)
_libc: ctypes.CDLL | None = None


def _prctl() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (Linux ≥ 3.4): orphans are reparented to it.

    Idempotent and process-wide. Returns True if this process is a subreaper now; False elsewhere than
    Linux or if refused.
    """
    if not sys.platform.startswith("linux"):
        return False
    _prctl().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    return is_subreaper()


def stop_being_subreaper() -> None:
    """Undo :func:`become_subreaper` (orphans go to init again)."""
    if sys.platform.startswith("linux"):
        _prctl().prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def is_subreaper() -> bool:
    """True if this process is a child subreaper (:func:`become_subreaper`)."""
    if not sys.platform.startswith("linux"):
        return False
    flag = ctypes.c_int(0)
    return _prctl().prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value != 0


def new_mark() -> str:
    """A mark unique to one command of this process."""
    return f"{os.getpid()}.{next(_counter)}"


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(c) for c in f.read().split())
    return out


def _tree() -> Iterator[int]:
    """Every descendant of this process (a subreaper: every process its commands started and that lives)."""
    todo = _children(os.getpid())
    while todo:
        pid = todo.pop()
        yield pid
        todo.extend(_children(pid))


def _stat(pid: int) -> tuple[str, int, int] | None:
    """State, parent pid and process group of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in b"\0" + f.read()
    except OSError:
        return False


def kill_escaped(mark: str, pgid: int, *, leader: int) -> int:
    """SIGKILL every live descendant that carries ``mark`` and reap them; reap the zombies of group ``pgid``.

    Call it once the command's leader (``leader``, reaped by its own waiter and never touched here) has
    ended and its group ``pgid`` was killed. Blocking, bounded: a killed process is awaited at most
    :data:`_REAP_WAIT_S`.

    Returns:
        How many processes it killed or reaped.
    """
    needle = f"\0{MARK_ENV}={mark}\0".encode()
    doomed: set[int] = set()
    for _ in range(8):  # a process may fork while it is being killed: walk again until none is left
        found = {p for p in _tree() if p != leader and p not in doomed and _alive_marked(p, needle)}
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        doomed |= found
    doomed |= {p for p in _tree() if p != leader and (st := _stat(p)) is not None and st[0] == "Z" and st[2] == pgid}
    for pid in doomed:
        _reap(pid)
    return len(doomed)


def _alive_marked(pid: int, needle: bytes) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z" and _carries(pid, needle)


def _reap(pid: int) -> None:
    """Wait for a SIGKILLed ``pid`` to be gone: reaped here once it is this process's zombie, or by its parent."""
    deadline = time.monotonic() + _REAP_WAIT_S
    while time.monotonic() < deadline:
        st = _stat(pid)
        if st is None:
            return
        if st[1] == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # a SIGKILLed child: returns as soon as it has died
            return
        time.sleep(0.005)  # its parent (killed too) is dying: then it is reparented here
