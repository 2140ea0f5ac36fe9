"""A child that dies with its parent: Linux's parent-death signal, armed between fork and exec; and a process
whose environment its children cannot read back (:func:`keep_environment_private`).

Below both :mod:`reel.shared.proc` (every command a tool or verifier runs,
:func:`reel.shared.proc.reaper.child_setup`) and :mod:`reel.shared.nats` (the embedded nats-server,
:mod:`reel.shared.nats.embedded`), which may not import each other. Only ``os``/``ctypes``: it
runs in the forked child, where nothing else is safe to use.
"""

from __future__ import annotations

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


def keep_environment_private() -> bool:
    """Mark this process non-dumpable (Linux ``prctl(PR_SET_DUMPABLE, 0)``): its ``/proc/<pid>/environ``,
    ``/proc/<pid>/mem`` and ptrace attach are then closed to other processes of the same user — so a tool
    this process starts cannot read the secrets in its environment from ``/proc/$PPID/environ``. A process
    with ``CAP_SYS_PTRACE`` (root, usually) still can: run tools as another user, or the service not as root
    (docs/security.md). No core dumps follow. True if set; False elsewhere than Linux or if refused."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 and libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


def die_with_parent(sig: int, owner: int) -> None:  # pragma: no cover - runs in the child, before exec
    """In a freshly forked child: get signal ``sig`` when the parent dies (kill -9 included); exit
    now (status 1) if the parent ``owner`` (its pid, taken before the fork) died before the signal
    was armed. Elsewhere than Linux: nothing (there is no such signal).

    Args:
        sig: the signal number delivered on the parent's death (e.g. ``signal.SIGKILL``).
        owner: the parent's pid (``os.getpid()`` in the parent, before the spawn).
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != owner:
            os._exit(1)
