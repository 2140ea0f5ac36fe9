"""A cancel stops what is in flight: a real nats-server, the real executor, cancel and verifier
services, real processes and real HTTP to the loopback chat-completions server. No mocks, no sleeps to sync.

In each case the work is seen gone from outside the executor — the tool's process group by the OS (pidfds,
``kill(-pgid, 0)``), the Python tool's coroutine by its own ``CancelledError``, the model call by the server
seeing its client close the connection — within a generous 5 s of the cancel (bench/cancel_latency.py
measures the real latency); the attempt is recorded ``cancelled`` in the commit right after ``run_cancelled``;
nothing is dispatched after it; a verifier already running on another run that is cancelled too still
records its verdict; a cold refold equals the executor's state.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from reel.services.cancel.app import serve as cancel_serve
from reel.services.verifier.app import serve as verifier_serve
from reel.shared.core.run.events import AttemptCancelled, VerdictRecorded
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.commands import Reply
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration import cancel_support as cs
from tests.integration import parking
from tests.integration.scenarios import attempt_of, wait_until
from tests.refold import assert_refold_identical
from tests.support.chat_server import ChatServer, Hang, hang

BOUND_S = 5.0  # generous: the measured latency is in docs/benchmarks.md
WAIT_S = 30.0


@pytest.fixture
async def services(infra: Infra, cfg: Config, executor: None) -> AsyncIterator[None]:
    async with running(cancel_serve, infra, cfg), running(verifier_serve, infra, cfg):
        yield


class Verifying:
    """Another run resting in Verifying whose (parking) verifier is running when the cancels come."""

    def __init__(self, client: ReelClient, infra: Infra, cfg: Config) -> None:
        self.client, self.infra, self.cfg, self.name = client, infra, cfg, f"park-{uuid.uuid4().hex[:8]}"
        self.rv = parking.arm(self.name)
        self.run_id = ""

    async def park(self) -> None:
        reply = await self.client.start(parse_workflow({"name": "parked", "steps": [
            {"kind": "tool", "id": "only", "tool": {"type": "recorded", "output": "done"}}],
            "verifiers": [{"type": "python", "name": self.name, "path": "tests.integration.parking:Parking",
                           "timeout_s": 60}]}))
        assert reply.ok and reply.run_id
        self.run_id = reply.run_id
        await asyncio.wait_for(self.rv.parked.wait(), WAIT_S)

    async def cancel_then_release(self, event_log: JetStreamEventLog) -> None:
        reply = await self.client.cancel(self.run_id, "cancelled beside the other")
        assert reply.ok and reply.status == "cancelled", reply
        verdicts = await self.infra.js.subscribe(self.cfg.names.verdict(self.run_id), ordered_consumer=True)
        try:
            self.rv.release.set()
            await verdicts.next_msg(timeout=WAIT_S)  # published only once recorded in the run's log
        finally:
            await verdicts.unsubscribe()
        commits = await event_log.read(self.run_id)
        at = [lsn for lsn, c in commits for e in c.events if isinstance(e, VerdictRecorded)]
        assert at and at[0] > reply.lsn, "the running verifier's verdict must still be recorded after the cancel"


async def _executor_idle(infra: Infra, cfg: Config) -> None:
    """Until the executor acked every command (it acks a run's command once the drive returned)."""
    async def idle() -> bool:
        info = await infra.js.consumer_info(cfg.names.commands_stream, cfg.names.consumer("executor"))
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_until(idle, timeout_s=30, what="the executor to finish driving the cancelled run")


async def _cancelled_cleanly(infra: Infra, cfg: Config, event_log: JetStreamEventLog, run_id: str, step_id: str,
                             reply: Reply) -> RunState:
    """The common end of every case: the attempt cancelled right after the cancel, nothing after; refold equal."""
    assert reply.ok and reply.status == "cancelled" and reply.lsn > 0, reply
    await _executor_idle(infra, cfg)
    state = await event_log.load(run_id)
    assert state.status == "cancelled" and state.cancel_reason == "user pressed stop"
    a = attempt_of(state, step_id, 1)
    assert (a.status, a.error_kind, a.outcome_lsn) == ("cancelled", "cancelled", reply.lsn + 1)
    assert a.error_message == "run cancelled: user pressed stop"
    assert state.head_lsn == reply.lsn + 1, "the executor committed more than the cancelled outcome"
    commits = await event_log.read(run_id)
    [last] = [c for lsn, c in commits if lsn > reply.lsn]
    assert [type(e) for e in last.events] == [AttemptCancelled] and last.writer.startswith("x-")
    for attempts in state.branches["main"].attempts.values():
        assert all(x.dispatched_lsn < reply.lsn for x in attempts), "an attempt was dispatched after the cancel"
    await assert_refold_identical(event_log, state)
    return state


async def _start(client: ReelClient, wf: dict[str, Any]) -> str:
    reply = await client.start(parse_workflow(wf))
    assert reply.ok and reply.run_id, reply
    return reply.run_id


def _agent(tools: list[dict[str, Any]], call: dict[str, Any] | None, model: dict[str, Any] | None = None,
           ) -> dict[str, Any]:
    scripted = {"adapter": "scripted", "turns": [{"tool_calls": [call]}, {"text": "done"}]}
    return {"name": "cancel-agent", "steps": [
        {"kind": "agent", "id": "solve", "instructions": "Work.", "max_turns": 3,
         "context": [{"id": "task", "kind": "task", "text": "wait"}],
         "model": model or scripted, "tools": tools},
        {"kind": "tool", "id": "next", "tool": {"type": "scripted", "outputs": ["never"]}}]}


# ---- a command tool: its process group is killed ------------------------------------------------------------
@pytest.mark.parametrize("where", ["tool_step", "agent_call"])
async def test_cancel_kills_a_sleeping_command_tools_process_group(
    services: None, infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path,
    where: str,
) -> None:
    verifying = Verifying(client, infra, cfg)
    await verifying.park()
    pids = cs.fifo(tmp_path)
    argv = cs.sleeper_argv(pids)
    if where == "tool_step":
        wf: dict[str, Any] = {"name": "cancel-cmd", "steps": [
            {"kind": "tool", "id": "slow", "tool": {"type": "command", "argv": argv}},
            {"kind": "tool", "id": "next", "tool": {"type": "scripted", "outputs": ["never"]}}]}
        step = "slow"
    else:
        wf = _agent([{"name": "sleeper", "command": argv, "timeout_s": 60}], {"name": "sleeper", "arguments": {}})
        step = "solve:t1:c0"
    run_id = await _start(client, wf)
    leader, child = await cs.fifo_rendezvous(pids)  # the tool runs: its group is the leader's pid
    assert cs.group_alive(leader)
    started = time.monotonic()
    reply = await client.cancel(run_id, "user pressed stop")
    gone = await asyncio.wait_for(asyncio.gather(cs.exited(leader), cs.exited(child)), BOUND_S)
    assert max(gone) - started < BOUND_S
    await cs.group_gone(leader)
    await _cancelled_cleanly(infra, cfg, event_log, run_id, step, reply)
    await verifying.cancel_then_release(event_log)


# ---- a Python tool: its task is cancelled; a sync one's late result is discarded -----------------------------
async def test_cancel_cancels_an_async_python_tool_awaiting_an_event(
    services: None, infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog,
) -> None:
    verifying = Verifying(client, infra, cfg)
    await verifying.park()
    gate = cs.arm()
    tool = {"name": "wait", "python": "tests.integration.cancel_support:wait_forever", "timeout_s": 60,
            "parameters": {"type": "object", "properties": {"token": {"type": "string"}}}}
    run_id = await _start(client, _agent([tool], {"name": "wait", "arguments": {"token": gate.token}}))
    await asyncio.wait_for(gate.started.wait(), WAIT_S)
    started = time.monotonic()
    reply = await client.cancel(run_id, "user pressed stop")
    await asyncio.wait_for(gate.stopped.wait(), BOUND_S)  # the tool's own coroutine saw the CancelledError
    assert gate.stopped_at - started < BOUND_S
    await _cancelled_cleanly(infra, cfg, event_log, run_id, "solve:t1:c0", reply)
    await verifying.cancel_then_release(event_log)


async def test_cancel_records_a_sync_python_tool_cancelled_at_once_and_discards_its_late_result(
    services: None, infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog,
) -> None:
    gate = cs.arm()
    tool = {"name": "block", "python": "tests.integration.cancel_support:block_sync", "timeout_s": 60,
            "parameters": {"type": "object", "properties": {"token": {"type": "string"}}}}
    run_id = await _start(client, _agent([tool], {"name": "block", "arguments": {"token": gate.token}}))
    await asyncio.wait_for(gate.started.wait(), WAIT_S)
    reply = await client.cancel(run_id, "user pressed stop")
    state = await _cancelled_cleanly(infra, cfg, event_log, run_id, "solve:t1:c0", reply)  # the thread still runs
    gate.release.set()
    await asyncio.wait_for(gate.finished.wait(), WAIT_S)  # its late result came back ...
    await _executor_idle(infra, cfg)
    after = await event_log.load(run_id)
    assert after.head_lsn == state.head_lsn, "... and was discarded: nothing more was committed"
    assert attempt_of(after, "solve:t1:c0", 1).output_ref is None


# ---- a model call: its HTTP request is aborted ---------------------------------------------------------------
@pytest.mark.parametrize("where", ["model_step", "agent_turn"])
async def test_cancel_aborts_a_model_call_that_never_answers(
    services: None, infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog,
    chat_server: ChatServer, where: str,
) -> None:
    verifying = Verifying(client, infra, cfg)
    await verifying.park()
    signal = Hang()
    chat_server.script(hang(signal))
    model = {"adapter": "openai", "base_url": chat_server.url, "model": "loopback-1", "timeout_s": 60}
    if where == "model_step":
        wf: dict[str, Any] = {"name": "cancel-model", "steps": [
            {"kind": "model", "id": "think", "model": model, "context": [{"id": "task", "text": "think"}]},
            {"kind": "tool", "id": "next", "tool": {"type": "scripted", "outputs": ["never"]}}]}
        step = "think"
    else:
        wf = _agent([], None, model)
        step = "solve:t1"
    run_id = await _start(client, wf)
    await asyncio.wait_for(signal.arrived.wait(), WAIT_S)  # the request is in flight, held by the server
    started = time.monotonic()
    reply = await client.cancel(run_id, "user pressed stop")
    await asyncio.wait_for(signal.closed.wait(), BOUND_S)  # the server saw the client close the connection
    assert signal.closed_at - started < BOUND_S
    await _cancelled_cleanly(infra, cfg, event_log, run_id, step, reply)
    assert len(chat_server.requests) == 1, "the model was called again after the cancel"
    await verifying.cancel_then_release(event_log)
