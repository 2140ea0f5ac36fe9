"""The 3-node cluster fixture leaves no nats-server behind when the process that started it is killed (kill -9:
no ``finally``, no ``atexit``): each server gets SIGKILL from the kernel when its parent dies (Linux's
parent-death signal). A real cluster in a real child process; the servers' ends are seen through pidfds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.integration.cancel_support import exited

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import asyncio, json, os, sys
from tests.support.cluster import cluster

async def main() -> None:
    async with cluster(workdir=sys.argv[1]) as c:
        print(json.dumps([n.process.pid for n in c.nodes]), flush=True)
        await asyncio.Event().wait()  # until killed

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
async def test_the_cluster_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, str(tmp_path), cwd=REPO,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    pids: list[int] = []
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        if not line:
            raise AssertionError(f"the child exited: {(await child.stderr.read()).decode()[-2000:]}")
        pids = json.loads(line)
        assert len(pids) == 3
        for pid in pids:
            os.kill(pid, 0)  # running
        child.send_signal(signal.SIGKILL)
        assert await child.wait() == -signal.SIGKILL
        await asyncio.wait_for(asyncio.gather(*(exited(pid) for pid in pids)), 15)  # every server went with it
    finally:
        for pid in pids:  # never leave one behind, whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if child.returncode is None:
            child.kill()
            await child.wait()
