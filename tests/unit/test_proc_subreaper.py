"""A descendant that left its process group (``setsid`` and a double fork) still dies with its command,
once the runner is a child subreaper (shared/proc/subreaper.py), on real processes.

The escaped grandchild holds a FIFO open for writing: EOF on it is the proof that it is dead, and
``/proc/<pid>`` gone that it was reaped (no zombie left behind).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reel.shared.proc.group import run_group
from reel.shared.proc.subreaper import become_subreaper, is_subreaper, stop_being_subreaper
from tests.unit.test_proc_group import Held

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper is Linux's")

# The leader forks a child that leaves the group (setsid) and forks the grandchild, then exits at once: the
# grandchild is an orphan in a session of its own. It opens FIFO argv[1], writes its pid there and sleeps, its
# stdout and stderr the command's pipes (argv[3] "loud") or /dev/null ("quiet"); the leader waits for it to be
# up, says so, then exits ("exit") or hangs ("hang").
DAEMON = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        if sys.argv[3] == "quiet":  # else it holds its command's output pipes
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
        fd = os.open(sys.argv[1], os.O_WRONLY)
        os.write(fd, f"{os.getpid()}\\n".encode())
        os.write(w, b"u")
        time.sleep(3600)
    os._exit(0)
os.read(r, 1)
print("daemon up", flush=True)
if sys.argv[2] == "hang":
    time.sleep(3600)
"""


@pytest.fixture
def escaped(tmp_path: Path) -> Iterator[Held]:
    held = Held(tmp_path / "grandchild.fifo")
    yield held
    held.close()


@pytest.fixture
def subreaper() -> Iterator[None]:
    assert become_subreaper() and is_subreaper()
    yield
    stop_being_subreaper()


def _reaped(pid: int) -> bool:
    """No ``/proc/<pid>``: dead and reaped (a zombie still has one)."""
    return not Path(f"/proc/{pid}").exists()


def _pid(held: Held) -> int:
    return int(held.data.split()[0])


async def test_a_grandchild_that_left_the_group_dies_when_the_command_ends(escaped: Held, subreaper: None) -> None:
    done = await run_group([sys.executable, "-c", DAEMON, str(escaped.path), "exit", "quiet"], timeout_s=60)
    assert done.exit_code == 0 and done.text() == "daemon up\n"
    assert await escaped.gone(), "the setsid grandchild outlived its command"
    assert _reaped(_pid(escaped))  # reaped, not left a zombie


async def test_a_grandchild_that_left_the_group_dies_when_the_command_times_out(escaped: Held,
                                                                                subreaper: None) -> None:
    argv = [sys.executable, "-c", DAEMON, str(escaped.path), "hang", "loud"]  # it holds the output pipes
    task = asyncio.create_task(run_group(argv, timeout_s=3))
    await escaped.until(b"\n")
    done = await task
    assert done.timed_out and done.text() == "daemon up\n"
    assert await escaped.gone(), "the setsid grandchild outlived its command's timeout"
    assert _reaped(_pid(escaped))


async def test_without_a_subreaper_the_grandchild_escapes(escaped: Held) -> None:
    """What the subreaper fixes: killing the group alone misses a process that called setsid."""
    assert not is_subreaper()
    done = await run_group([sys.executable, "-c", DAEMON, str(escaped.path), "exit", "quiet"], timeout_s=60)
    assert done.exit_code == 0
    try:
        assert escaped.held()  # alive, in a session of its own, reparented to init
    finally:
        os.kill(_pid(escaped), signal.SIGKILL)
