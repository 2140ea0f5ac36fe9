"""A service's tools cannot read its secrets back from ``/proc/$PPID/environ``: the process is non-dumpable
(``reel.shared.runtime.deathsig.keep_environment_private``). Real processes: a parent holding a canary in its
environment, running as an unprivileged user (root would pass the check by CAP_SYS_PTRACE), starts a child of
the same user that tries to read the parent's environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

PARENT = """
import ctypes, os, subprocess, sys
from reel.shared.runtime.deathsig import keep_environment_private  # imported first: nobody may not read the repo
if os.getuid() == 0:
    os.setgid(65534); os.setuid(65534)  # nobody: an unprivileged parent and child of one user
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again, as a process started as that user is
if sys.argv[1] == "private":
    assert keep_environment_private()
done = subprocess.run(["cat", f"/proc/{os.getpid()}/environ"], capture_output=True)
print("read" if b"REEL_CANARY=canary-secret-0001" in done.stdout else "refused")
"""


def _child_reads(mode: str) -> str:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "REEL_CANARY": "canary-secret-0001"}
    out = subprocess.run([sys.executable, "-c", PARENT, mode], capture_output=True, text=True, env=env, cwd="/",
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_a_child_cannot_read_a_private_parents_environment() -> None:
    assert _child_reads("open") == "read"  # what any tool could do before
    assert _child_reads("private") == "refused"
