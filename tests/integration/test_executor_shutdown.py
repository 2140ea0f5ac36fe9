"""Graceful shutdown: a stopping executor finishes the attempt in flight, then hands the run back; past its drain
deadline it interrupts the attempt instead (recorded ``interrupted``: retried elsewhere, not a try)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from reel.services.executor.app import serve as executor_serve
from reel.shared.core.run.events import RunStarted
from reel.shared.core.run.state import INTERRUPTED
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration import cancel_support as cs
from tests.integration.scenarios import wait_until
from tests.refold import assert_refold_identical


async def test_stopping_executor_finishes_its_attempt_and_hands_the_run_back(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path
) -> None:
    started, gate = tmp_path / "started", tmp_path / "gate"
    spec = parse_workflow({"name": "handback", "steps": [
        {"kind": "tool", "id": "slow", "tool": {"type": "command", "argv": [
            "sh", "-c", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done; echo slow-done"]}},
        {"kind": "tool", "id": "after", "tool": {"type": "scripted", "outputs": ["after-done"]}},
    ]})
    async with running(executor_serve, infra, cfg) as stop_a:  # A
        reply = await client.start(spec)
        assert reply.run_id
        await wait_until(lambda: asyncio.to_thread(started.exists), timeout_s=30,
                         what="the slow step to start")  # A is inside it
        stop_a.set()  # SIGTERM, in effect
        gate.touch()
    # A drained (the block awaited it): it recorded the outcome, then handed the run back
    mid = await event_log.load(reply.run_id)
    assert mid.status == "running"
    assert mid.branches["main"].attempts["slow"][0].status == "succeeded"
    assert "after" not in mid.branches["main"].attempts

    async with running(executor_serve, infra, cfg):  # B
        state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    claims = [e.executor_id for _, c in await event_log.read(reply.run_id) for e in c.events
              if isinstance(e, RunStarted)]
    assert len(claims) == 2 and claims[0] != claims[1]  # B took over from the log
    assert [a.status for a in state.branches["main"].attempts["slow"]] == ["succeeded"]  # not repeated
    assert state.branches["main"].attempts["after"][0].status == "succeeded"
    await assert_refold_identical(event_log, state)


@pytest.mark.parametrize("where", ["tool_step", "agent_call"])
async def test_past_the_drain_deadline_the_attempt_is_interrupted_and_retried_elsewhere(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path, where: str,
) -> None:
    pids = cs.fifo(tmp_path)
    # attempt 1 sleeps (in its group, with a background child); attempt 2 answers at once
    argv = ["sh", "-c", f'if [ "$REEL_ATTEMPT" = 1 ]; then sleep 20 & echo $$ $! > "{pids}"; wait; fi; echo done']
    if where == "tool_step":
        steps: list[dict[str, Any]] = [{"kind": "tool", "id": "slow", "tool": {"type": "command", "argv": argv}}]
        step = "slow"
    else:
        steps = [{"kind": "agent", "id": "solve", "instructions": "Work.",
                  "context": [{"id": "task", "kind": "task", "text": "wait"}],
                  "model": {"adapter": "scripted", "turns": [
                      {"tool_calls": [{"name": "sleeper", "arguments": {}}]}, {"text": "finished"}]},
                  "tools": [{"name": "sleeper", "command": argv, "retry_safe": True, "timeout_s": 60}]}]
        step = "solve:t1:c0"
    spec = parse_workflow({"name": "drained", "steps": [
        *steps, {"kind": "tool", "id": "after", "tool": {"type": "scripted", "outputs": ["after-done"]}}]})
    async with running(executor_serve, infra, dataclasses.replace(cfg, drain_deadline_s=0.2)) as stop_a:  # A
        reply = await client.start(spec)
        assert reply.run_id
        leader, child = await cs.fifo_rendezvous(pids)  # A is inside attempt 1
        stop_a.set()  # SIGTERM, in effect; the attempt outlives the drain deadline
        await asyncio.wait_for(asyncio.gather(cs.exited(leader), cs.exited(child)), 5)
        await cs.group_gone(leader)
    # A (the block awaited it) recorded the attempt interrupted, then handed the run back
    mid = await event_log.load(reply.run_id)
    assert mid.status == "running"
    [first] = mid.branches["main"].attempts[step]
    assert (first.status, first.error_kind, first.retryable) == ("failed", INTERRUPTED, True)
    assert "drain deadline" in (first.error_message or "")

    async with running(executor_serve, infra, cfg):  # B
        state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    attempts = state.branches["main"].attempts[step]
    # max_attempts is 1: the interrupted attempt was not a try of the step; B ran a new one
    assert [(x.attempt, x.status) for x in attempts] == [(1, "failed"), (2, "succeeded")]
    assert attempts[1].executor_id != attempts[0].executor_id
    assert state.branches["main"].attempts["after"][0].status == "succeeded"
    await assert_refold_identical(event_log, state)
