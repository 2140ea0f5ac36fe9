"""The process-group runner on real processes: the group dies on every way out (shared/proc/group.py).

No sleep synchronises anything here. The processes under test hold a FIFO open
for writing (:class:`Held`): the test reads their "up" line through it, and EOF
on it is the proof that every holder is dead.
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
from reel.shared.proc.reaper import REGISTRY_ENV, reap_orphans

ROOT = Path(__file__).parents[2]
PY = sys.executable

# The group leader: holds FIFO argv[1], starts a grandchild (same group) holding FIFO argv[2], waits for it to be
# up, says "up" on argv[1], then exits ("exit") or stays ("hang"). The grandchild's stdio are /dev/null, so its
# parent's pipes close when the parent exits.
GRANDCHILD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); os.write(int(sys.argv[2]), b'u'); " \
             "time.sleep(3600)"
LEADER = f"""
import os, subprocess, sys, time
mine = os.open(sys.argv[1], os.O_WRONLY)
r, w = os.pipe()
subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}, sys.argv[2], str(w)], pass_fds=(w,),
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.close(w)
os.read(r, 1)
os.write(mine, b"up\\n")
print("leader ready", flush=True)
if sys.argv[3] == "hang":
    time.sleep(3600)
"""


class Held:
    """A FIFO that processes under test open for writing; EOF once every one of them is gone."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self._r = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._w: int | None = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ours: no EOF before the holders open
        self.data = b""

    async def _chunk(self) -> bytes | None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        loop.add_reader(self._r, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(self._r)
        try:
            return os.read(self._r, 4096)
        except BlockingIOError:
            return None

    async def until(self, marker: bytes, within_s: float = 30) -> None:
        """Wait until a holder wrote ``marker``."""
        async with asyncio.timeout(within_s):
            while marker not in self.data:
                self.data += await self._chunk() or b""

    def _release(self) -> None:
        if self._w is not None:
            os.close(self._w)
            self._w = None

    def held(self) -> bool:
        """Whether some process still holds the FIFO (answered now, without waiting)."""
        self._release()
        while True:
            try:
                chunk = os.read(self._r, 4096)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self.data += chunk

    async def gone(self, within_s: float = 10) -> bool:
        """True once every holder is dead (EOF); False if one still holds it after ``within_s``."""
        self._release()
        try:
            async with asyncio.timeout(within_s):
                while (chunk := await self._chunk()) != b"":
                    self.data += chunk or b""
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self._release()
        os.close(self._r)


@pytest.fixture
def fifos(tmp_path: Path) -> Iterator[tuple[Held, Held]]:
    """(the leader's FIFO, the grandchild's FIFO)."""
    pair = (Held(tmp_path / "leader.fifo"), Held(tmp_path / "grandchild.fifo"))
    yield pair
    for h in pair:
        h.close()


def _leader(fifos: tuple[Held, Held], mode: str) -> list[str]:
    return [PY, "-c", LEADER, str(fifos[0].path), str(fifos[1].path), mode]


async def test_a_grandchild_left_running_after_a_normal_exit_is_killed(fifos: tuple[Held, Held]) -> None:
    done = await run_group(_leader(fifos, "exit"), timeout_s=60)
    assert (done.exit_code, done.signal, done.timed_out) == (0, None, False)
    assert done.text() == "leader ready\n" and done.duration_ms >= 0
    assert await fifos[0].gone() and fifos[0].data == b"up\n"  # the leader said up, then exited
    assert await fifos[1].gone(), "the background grandchild outlived a normal exit"


async def test_a_timeout_kills_the_group_and_keeps_the_output_so_far(fifos: tuple[Held, Held]) -> None:
    task = asyncio.create_task(run_group(_leader(fifos, "hang"), timeout_s=3))
    await fifos[0].until(b"up")  # the group is whole when the deadline comes
    done = await task
    assert done.timed_out and done.exit_code is None and done.signal == signal.SIGKILL
    assert done.returncode == -signal.SIGKILL
    assert done.text() == "leader ready\n"
    assert await fifos[0].gone() and await fifos[1].gone()


async def test_cancelling_the_awaiting_task_kills_the_group(fifos: tuple[Held, Held]) -> None:
    task = asyncio.create_task(run_group(_leader(fifos, "hang"), timeout_s=None))
    await fifos[0].until(b"up")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await fifos[0].gone() and await fifos[1].gone()


async def test_term_grace_sends_sigterm_first(tmp_path: Path) -> None:
    """With a grace, a leader that handles SIGTERM exits by itself (the ``reel up`` shape: drain, then exit)."""
    held = Held(tmp_path / "term.fifo")
    script = ("import os, signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
              f"fd = os.open({str(held.path)!r}, os.O_WRONLY); os.write(fd, b'up')\n"
              "time.sleep(3600)\n")
    try:
        task = asyncio.create_task(run_group([PY, "-c", script], timeout_s=3, term_grace_s=30))
        await held.until(b"up")  # its handler is installed when the deadline comes
        done = await task
        assert done.timed_out and (done.exit_code, done.signal) == (7, None)
        assert await held.gone()
    finally:
        held.close()


@pytest.mark.parametrize(("keep", "expect"), [("head", b"a" * 1000), ("tail", b"b" * 1000)])
async def test_output_limits_keep_the_head_or_the_tail(keep: str, expect: bytes) -> None:
    n = 300_000  # several pipe reads each side of the cut
    script = f"import sys; sys.stdout.buffer.write(b'a' * {n} + b'b' * {n}); sys.stderr.write('e' * 10)"
    done = await run_group([PY, "-c", script], timeout_s=60, output_limit_bytes=1000, keep=keep)  # type: ignore[arg-type]
    assert done.stdout == expect and done.stdout_truncated
    assert done.stderr == b"e" * 10 and not done.stderr_truncated and done.truncated
    whole = await run_group([PY, "-c", script], timeout_s=60, output_limit_bytes=2 * n, keep=keep)  # type: ignore[arg-type]
    assert whole.stdout == b"a" * n + b"b" * n and not whole.truncated


async def test_stdin_env_cwd_and_merged_stderr(tmp_path: Path) -> None:
    script = ("import os, sys; d = sys.stdin.read(); print(d, os.environ['ONLY'], os.getcwd(), sep='|'); "
              "sys.stderr.write('to-err')")
    done = await run_group([PY, "-c", script], timeout_s=60, stdin=b"in", env={"ONLY": "x"}, cwd=tmp_path,
                           merge_stderr=True)
    assert done.text() == f"in|x|{tmp_path}\nto-err" and done.stderr == b""
    assert done.last_line() == "to-err"
    silent = await run_group([PY, "-c", "import sys; print(repr(sys.stdin.read()))"], timeout_s=60)
    assert silent.text() == "''\n"  # no stdin given: /dev/null


async def test_a_leader_ended_by_a_signal_and_a_missing_program() -> None:
    done = await run_group(["sh", "-c", "echo bye; kill -TERM $$"], timeout_s=60)
    assert (done.exit_code, done.signal, done.returncode, done.timed_out) == (None, signal.SIGTERM, -15, False)
    assert done.text() == "bye\n"
    with pytest.raises(FileNotFoundError):
        await run_group(["/nonexistent/program"], timeout_s=60)


async def test_parent_death_kills_the_leader_and_the_reaper_the_rest(
        fifos: tuple[Held, Held], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of the owner: the parent-death signal kills the leader at once; the grandchild runs on until
    the next owner on the host reaps the group from the registry."""
    records = tmp_path / "groups"
    monkeypatch.setenv(REGISTRY_ENV, str(records))
    owner = ("import asyncio, sys\n"
             "from reel.shared.proc.group import run_group\n"
             "asyncio.run(run_group(sys.argv[1:], timeout_s=None))\n")
    parent = await asyncio.create_subprocess_exec(PY, "-c", owner, *_leader(fifos, "hang"), cwd=ROOT)
    await fifos[0].until(b"up")
    assert [p.name for p in records.iterdir()] != []  # the leader recorded its group before it ran
    os.kill(parent.pid, signal.SIGKILL)
    await parent.wait()
    assert await fifos[0].gone(), "the leader outlived its parent"
    assert fifos[1].held(), "the grandchild is still running (what the reaper is for)"
    assert reap_orphans() == 1
    assert await fifos[1].gone()
    assert list(records.iterdir()) == []
    assert reap_orphans() == 0


async def test_the_reaper_leaves_groups_of_a_live_owner(fifos: tuple[Held, Held], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    records = tmp_path / "groups"
    monkeypatch.setenv(REGISTRY_ENV, str(records))
    task = asyncio.create_task(run_group(_leader(fifos, "hang"), timeout_s=None))
    await fifos[0].until(b"up")
    assert reap_orphans() == 0 and fifos[1].held()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await fifos[1].gone() and list(records.iterdir()) == []


async def _exited(pidfd: int, within_s: float = 10) -> None:
    """Wait until the process of ``pidfd`` (not our child) exits: the pidfd turns readable."""
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
    try:
        await asyncio.wait_for(exited, within_s)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


async def test_cancelled_while_spawning_the_group_is_killed_and_forgotten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = tmp_path / "groups"
    monkeypatch.setenv(REGISTRY_ENV, str(records))
    task = asyncio.create_task(run_group([PY, "-c", "import time; time.sleep(3600)"], timeout_s=None))
    # loop steps, not time: the child records itself within the spawn's first step, before its pipes connect
    while not (records.is_dir() and any(records.iterdir())):  # noqa: ASYNC110 - no event exists inside asyncio
        await asyncio.sleep(0)
    (record,) = records.iterdir()
    leader = os.pidfd_open(int(record.name.split(".")[1]))
    task.cancel()  # run_group still waits for the spawn to connect the child's pipes
    with pytest.raises(asyncio.CancelledError):
        await task
    await _exited(leader)
    assert list(records.iterdir()) == []
