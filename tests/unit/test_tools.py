"""Tool steps' commands: process groups die with the attempt (timeout, cancellation)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path

import pytest

from reel.shared.core.errors import ToolError
from reel.shared.core.workflow.spec import ToolSpec
from reel.shared.core.workflow.toolspec import OUTPUT_TOO_LARGE, OutputLimit
from reel.shared.proc.tools import SPOOL_MEMORY_BYTES, CallId, reap_orphaned_tools, run_tool
from tests.support import print_bytes

CALL = CallId("r-1", "main", "s", 1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if not _alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


def _read_pid(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


async def _pid_from(path: Path) -> int:
    for _ in range(500):
        pid = _read_pid(path)
        if pid is not None:
            return pid
        await asyncio.sleep(0.01)
    raise AssertionError("the tool never wrote its child's pid")


def _spawning(pidfile: Path, timeout_s: float = 60) -> ToolSpec:
    # the tool starts a grandchild that would outlive a naive kill of the direct child
    return ToolSpec(type="command", argv=("sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"), timeout_s=timeout_s)


async def test_cancelling_an_attempt_kills_the_whole_tool_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    task = asyncio.create_task(run_tool(_spawning(pidfile), CALL))
    child = await _pid_from(pidfile)
    assert _alive(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _gone(child), "the tool's background child survived the cancelled attempt"


async def test_a_timed_out_tool_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    with pytest.raises(ToolError) as err:
        await run_tool(_spawning(pidfile, timeout_s=0.5), CALL)
    assert err.value.kind == "timeout"
    assert await _gone(await _pid_from(pidfile))


async def test_the_attempt_identity_is_in_the_tool_environment() -> None:
    spec = ToolSpec(type="command", argv=("sh", "-c", "echo $REEL_RUN_ID/$REEL_STEP_ID/$REEL_ATTEMPT"
                                                      " $REEL_IDEMPOTENCY_KEY $REEL_TOOL_NAME"))
    with await run_tool(spec, CallId("r-1", "main", "s", 2)) as out:
        assert out.read().strip() == b"r-1/s/2 r-1/main/s s"  # unnamed: the tool step's id


async def test_a_failing_command_reports_its_exit_code() -> None:
    with pytest.raises(ToolError) as err:
        await run_tool(ToolSpec(type="command", argv=("sh", "-c", "echo boom; exit 7")), CALL)
    assert err.value.kind == "exit_7" and "boom" in err.value.message


PRINTER = str(Path(__file__).parents[1] / "support" / "print_bytes.py")


def _printing(n_bytes: int) -> ToolSpec:
    """A command printing ``n_bytes`` of a non-repeating pattern, then ``END`` on stderr (merged)."""
    return ToolSpec(type="command", argv=("sh", "-c", f"{sys.executable} {PRINTER} {n_bytes}; printf END >&2"))


def _expected(n_bytes: int) -> bytes:
    return print_bytes.expected(n_bytes) + b"END"


async def test_an_output_under_its_cap_is_spooled_whole_with_its_sha256() -> None:
    n = 3 * SPOOL_MEMORY_BYTES + 123  # past the in-memory part: it rolled over to a temp file
    with await run_tool(_printing(n), CALL, limit=OutputLimit(max_bytes=n + 3)) as out:
        whole = out.read()
        assert whole == _expected(n) and not out.truncated
        assert (out.size_bytes, out.seen_bytes) == (n + 3, n + 3)
        assert out.sha256 == hashlib.sha256(whole).hexdigest()


async def test_an_output_past_its_cap_fails_output_too_large_by_default() -> None:
    with pytest.raises(ToolError) as err:
        await run_tool(_printing(100_000), CALL, limit=OutputLimit(max_bytes=4096))
    assert err.value.kind == OUTPUT_TOO_LARGE and err.value.retryable
    assert "100003 bytes" in err.value.message and "4096" in err.value.message


async def test_truncate_keeps_the_head_and_says_so() -> None:
    with await run_tool(_printing(100_000), CALL, limit=OutputLimit(max_bytes=4096,
                                                                          on_overflow="truncate")) as out:
        head = out.read()
        assert head == _expected(100_000)[:4096] and out.truncated
        assert (out.size_bytes, out.seen_bytes) == (4096, 100_003)
        assert out.sha256 == hashlib.sha256(head).hexdigest()


async def test_a_command_exiting_nonzero_past_its_cap_reports_its_last_words() -> None:
    spec = ToolSpec(type="command", argv=("sh", "-c", f"{sys.executable} {PRINTER} 50000; echo last-words; exit 3"))
    with pytest.raises(ToolError) as err:
        await run_tool(spec, CALL, limit=OutputLimit(max_bytes=1000, on_overflow="truncate"))
    assert err.value.kind == "exit_3" and err.value.message.rstrip().endswith("last-words")


async def test_tool_groups_left_by_a_killed_executor_are_reaped(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of an executor: its tool's grandchild survives the parent-death signal; the next executor
    started on the host kills that process group."""
    monkeypatch.setenv("REEL_TOOL_DIR", str(tmp_path / "tools"))
    pidfile = tmp_path / "grandchild.pid"
    executor = (
        "import asyncio\n"
        "from reel.shared.proc.tools import CallId, reap_orphaned_tools, run_tool\n"
        "from reel.shared.core.workflow.spec import ToolSpec\n"
        f"spec = ToolSpec(type='command', argv=('sh', '-c', 'sleep 60 & echo $! > {pidfile}; wait'))\n"
        "asyncio.run(run_tool(spec, CallId('r-x', 'main', 's', 1)))\n"
    )
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", executor, cwd=Path(__file__).parents[2])
    grandchild = await _pid_from(pidfile)
    proc.kill()  # SIGKILL: no cleanup runs in the executor
    await proc.wait()
    assert _alive(grandchild), "the grandchild outlived its executor (the case being tested)"
    assert reap_orphaned_tools() == 1
    assert await _gone(grandchild)
    assert not list((tmp_path / "tools").iterdir())
