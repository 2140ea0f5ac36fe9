"""kill -9 of an executor while an MCP tool call it holds open waits for its elicitation's answer.

A real executor process drives an agent whose turn calls ``paint`` of a stdio MCP server of the tests' own
(tests/support/mcp_server.py), declared ``retry_safe``; the server elicits, the run rests in ``awaiting_input``
with the request. The executor is killed (SIGKILL) and a second one started. The first request's answer wakes
the run; the dead executor's call is run again (attempt 2, a new server process), which asks again: a new
request, whose answer is the one the server gets.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reel.shared.core.input import requestfold
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.runtime.config import Config
from tests.faults.checks import check_runs
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import ServiceProcs
from tests.faults.scenario import fault_cfg, record, start_all
from tests.integration.scenarios import attempt_of

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]


async def _asked(client: ReelClient, run_id: str, not_this: str = "") -> str:
    """The id of the run's open request other than ``not_this``, once it rests awaiting it."""
    async for state in client.watch(run_id):
        found = [r for r, _ in requestfold.open_calls(state) if r.request_id != not_this]
        if found and state.status == "awaiting_input":
            assert found[0].kind == "elicitation", found
            return str(found[0].request_id)
    raise AssertionError("unreachable")


async def test_an_elicitation_of_a_dead_executor_is_asked_again_by_the_rerun_call(
    cfg: Config, client: ReelClient, tmp_path: Path, faults_ledger: FaultsLedger,
) -> None:
    cfg = fault_cfg(cfg)
    server = {"command": [sys.executable, "-m", "tests.support.mcp_server"], "include": ["paint"], "retry_safe": True}
    spec = parse_workflow({"name": "mcp-elicit-kill", "steps": [{
        "kind": "agent", "id": "a", "context": [{"id": "task", "kind": "task", "text": "paint"}],
        "model": {"adapter": "scripted", "turns": [
            {"tool_calls": [{"name": "own__paint", "arguments": {"thing": "door"}}]}, {"text": "ok"}]},
        "tools": [{"name": "own", "mcp": server}]}]})
    async with ServiceProcs(cfg, tmp_path) as procs:
        await procs.start("verifier")
        await procs.start("recovery")
        await procs.start("cancel")
        first = await procs.start("executor")
        (reply,) = await start_all(client, [spec])
        run_id = str(reply.run_id)
        q1 = await _asked(client, run_id)
        await procs.kill(first)
        await procs.start("executor")
        answered = await client.respond(run_id, q1, "answer", text="red")
        assert answered.ok, answered
        q2 = await _asked(client, run_id, not_this=q1)  # the call ran again and its server asked again
        assert (await client.respond(run_id, q2, "answer", text="green")).ok
        counts = await check_runs(client.log, [run_id], timeout_s=120)  # completed once, refolds identically
        record(faults_ledger, "mcp_elicit_kill", counts, procs)
    state = await client.log.load(run_id)
    assert state.status == "completed"
    assert attempt_of(state, "a:t1:c0", 1).status == "failed"
    rerun = attempt_of(state, "a:t1:c0", 2)
    assert rerun.status == "succeeded" and rerun.output_ref is not None
    assert (await client.blobs.get(rerun.output_ref)).decode() == "painted the door green"
