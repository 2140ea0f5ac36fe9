"""kill -9 of an executor while two MCP tool calls are in flight on its stdio server.

A real executor process drives an agent whose one turn calls ``hold`` of a stdio MCP server of the tests' own
(tests/support/mcp_server.py) twice at once — through an entry that declares it ``retry_safe`` and through one
that does not. Once both calls are running at the server (each wrote the server's pid to a FIFO the test reads),
the executor is killed (SIGKILL). Its server dies with it (the parent-death signal); a second executor takes the
run over: it re-runs the retry-safe call (a new server process, a new attempt) and records the other
``outcome_unknown``; the run completes.
"""

from __future__ import annotations

import asyncio
import os
import select
import sys
from pathlib import Path

import pytest

from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.runtime.config import Config
from tests.faults.checks import check_runs
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import ServiceProcs
from tests.faults.scenario import fault_cfg, record, start_all
from tests.integration.scenarios import attempt_of

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]


async def _exited(pid: int, timeout_s: float) -> bool:
    """Whether process ``pid`` is gone within ``timeout_s`` (a pidfd turns readable when it exits)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool((await asyncio.to_thread(select.select, [fd], [], [], timeout_s))[0])
    finally:
        os.close(fd)


async def test_a_call_in_flight_is_rerun_if_retry_safe_else_outcome_unknown(
    cfg: Config, client: ReelClient, tmp_path: Path, faults_ledger: FaultsLedger,
) -> None:
    cfg = fault_cfg(cfg)
    safe, unsafe = tmp_path / "safe", tmp_path / "unsafe"
    for fifo in (safe, unsafe):
        os.mkfifo(fifo)
    server = {"command": [sys.executable, "-m", "tests.support.mcp_server"], "include": ["hold"]}
    spec = parse_workflow({"name": "mcp-kill", "steps": [{
        "kind": "agent", "id": "a", "context": [{"id": "task", "kind": "task", "text": "hold"}],
        "model": {"adapter": "scripted", "turns": [
            {"tool_calls": [{"name": "safe__hold", "arguments": {"marker": str(safe)}},
                            {"name": "unsafe__hold", "arguments": {"marker": str(unsafe)}}]},
            {"text": "ok"}]},
        "tools": [{"name": "safe", "mcp": {**server, "retry_safe": True}},
                  {"name": "unsafe", "mcp": {**server, "retry_safe": False}}]}]})
    async with ServiceProcs(cfg, tmp_path) as procs:
        await procs.start("verifier")
        await procs.start("recovery")
        first = await procs.start("executor")
        started = asyncio.ensure_future(start_all(client, [spec]))
        pids = await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(f.read_text) for f in (safe, unsafe))), 90)
        (pid,) = {int(p) for p in pids}  # one server process serves both entries (the same connection)
        await procs.kill(first)
        assert await _exited(pid, 10), f"the MCP server {pid} outlived its executor"
        await procs.start("executor")
        (reply,) = await started
        counts = await check_runs(client.log, [reply.run_id], timeout_s=120)  # completed once, refolds identically
        record(faults_ledger, "mcp_executor_kill", counts, procs)
    state = await client.log.load(reply.run_id)
    assert state.status == "completed"
    rerun = attempt_of(state, "a:t1:c0", 2)
    assert rerun.status == "succeeded"
    assert attempt_of(state, "a:t1:c0", 1).status == "failed"
    unknown = attempt_of(state, "a:t1:c1", 1)
    assert unknown.error_kind == "outcome_unknown", unknown
    assert [a.attempt for a in state.branches["main"].attempts["a:t1:c1"]] == [1]  # never run again
