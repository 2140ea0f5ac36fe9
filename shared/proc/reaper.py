"""Process groups that outlive their owner: the child's own setup, the registry, the reaper.

:func:`~reel.shared.proc.group.run_group` starts every child through :func:`child_setup`
(between fork and exec, in the child). It makes the child die with its owner
(Linux's parent-death signal, kill -9 of the owner included) and, when
``$REEL_TOOL_DIR`` names a directory, writes the record ``<owner pid>.<pgid>``
there — from the child itself, so the record exists before the command can start
children of its own. The parent-death signal reaches only that direct child: its
children (``sh -c "…; sleep …"``) would run on. :func:`reap_orphans`, run by the
next executor started on the host, kills the groups whose owner is gone.

A record holds two start times (``/proc/<pid>/stat`` field 22, clock ticks since
boot): the owner's and the group leader's, so that a recycled pid is never
taken for the owner or the leader it replaced.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from reel.shared.runtime.deathsig import die_with_parent

REGISTRY_ENV = "REEL_TOOL_DIR"
"""The environment variable naming the registry directory (no registry when unset)."""

_STARTTIME_FIELD = 19  # of the fields after the ``(comm)`` of /proc/<pid>/stat


def registry() -> Path | None:
    """The registry directory ``$REEL_TOOL_DIR``, or ``None`` when unset."""
    d = os.environ.get(REGISTRY_ENV)
    return Path(d) if d else None


def _stat(pid: int | str) -> list[str] | None:
    """The fields after ``(comm)`` of ``/proc/<pid>/stat`` (state first), or ``None`` if there is no such process."""
    try:  # os-level calls only: this also runs in a forked child, before exec
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        return raw.rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def _start_time(pid: int | str) -> str | None:
    fields = _stat(pid)
    return fields[_STARTTIME_FIELD] if fields and len(fields) > _STARTTIME_FIELD else None


def child_setup(owner: int, records: Path | None) -> None:  # pragma: no cover - runs in the child, before exec
    """In the new process, before it runs anything: die with ``owner``, then record the group.

    Args:
        owner: the pid of the process that spawned this one (the owner of the group).
        records: the registry directory, or ``None`` to record nothing.
    """
    die_with_parent(signal.SIGKILL, owner)
    if records is not None:
        me = os.getpid()  # start_new_session: the group id is this pid
        fd = os.open(records / f"{owner}.{me}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{_start_time(owner) or ''} {_start_time('self') or ''}".encode())
        finally:
            os.close(fd)


def forget(records: Path | None, pgid: int) -> None:
    """Drop this process's record of group ``pgid`` (the group is dead: killed by its owner)."""
    if records is not None:
        (records / f"{os.getpid()}.{pgid}").unlink(missing_ok=True)


def _members(pgid: int) -> list[str]:
    """Pids (as in /proc) of the live processes of group ``pgid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(stat.parent.name)
        if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            out.append(stat.parent.name)
    return out


def _owner_alive(owner: int, started: str | None) -> bool:
    """True if ``owner`` runs (not a zombie) and is the process that wrote the record (same start time)."""
    fields = _stat(owner)
    if not fields or fields[0] == "Z" or len(fields) <= _STARTTIME_FIELD:
        return False
    return not started or fields[_STARTTIME_FIELD] == started


def _is_ours(pgid: int, leader_started: str | None) -> bool:
    """True if group ``pgid`` still has live members and is the group the record was written for.

    Its leader alive must be the very process (same start time). Its leader gone,
    the pid cannot have been recycled while members of the group live (Linux keeps
    a pid reserved while a group uses it), so the members left are the orphans.
    """
    members = _members(pgid)
    if not members:
        return False
    if str(pgid) in members and leader_started:
        return _start_time(pgid) == leader_started
    return True


def reap_orphans() -> int:
    """Kill the process groups recorded by owners of this host that died (kill -9, OOM).

    Every owner records its groups in ``$REEL_TOOL_DIR`` (see module doc); this
    kills the groups whose owner is gone and drops their records. A record whose
    owner lives is left alone. Linux only (elsewhere nothing is recorded).

    Returns:
        How many groups it killed.
    """
    d = registry()
    if d is None or not d.is_dir():
        return 0
    killed = 0
    for entry in d.iterdir():
        try:
            owner, pgid = (int(x) for x in entry.name.split("."))
            owner_started, leader_started = ([*entry.read_text().split(), "", ""])[:2]
        except (ValueError, OSError):
            continue
        if _owner_alive(owner, owner_started):
            continue
        if _is_ours(pgid, leader_started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
        entry.unlink(missing_ok=True)
    return killed
