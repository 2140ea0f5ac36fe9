"""Graceful shutdown: a stopping executor finishes the attempt in flight, then hands the run back."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.executor.app import serve as executor_serve
from shared.config import Config
from shared.core.events import RunStarted
from shared.core.workflow import parse_workflow
from shared.nats.client import ReelClient
from shared.nats.eventlog import JetStreamEventLog
from shared.nats.infra import Infra
from tests.refold import assert_refold_identical


async def _until(path: Path) -> None:
    for _ in range(3000):
        if await asyncio.to_thread(path.exists):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


async def test_stopping_executor_finishes_its_attempt_and_hands_the_run_back(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path
) -> None:
    started, gate = tmp_path / "started", tmp_path / "gate"
    spec = parse_workflow({"name": "handback", "steps": [
        {"kind": "tool", "id": "slow", "tool": {"type": "command", "argv": [
            "sh", "-c", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done; echo slow-done"]}},
        {"kind": "tool", "id": "after", "tool": {"type": "scripted", "outputs": ["after-done"]}},
    ]})
    stop_a = asyncio.Event()
    a = asyncio.create_task(executor_serve(infra, cfg, stop_a))
    reply = await client.start(spec)
    assert reply.run_id
    await _until(started)  # A is inside the slow step
    stop_a.set()  # SIGTERM, in effect
    gate.touch()
    await asyncio.wait_for(a, 30)  # A drained: it recorded the outcome, then handed the run back
    mid = await event_log.load(reply.run_id)
    assert mid.status == "running"
    assert mid.branches["main"].attempts["slow"][0].status == "succeeded"
    assert "after" not in mid.branches["main"].attempts

    stop_b = asyncio.Event()
    b = asyncio.create_task(executor_serve(infra, cfg, stop_b))
    try:
        state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    finally:
        stop_b.set()
        await asyncio.wait_for(b, 30)
    claims = [e.executor_id for _, c in await event_log.read(reply.run_id) for e in c.events
              if isinstance(e, RunStarted)]
    assert len(claims) == 2 and claims[0] != claims[1]  # B took over from the log
    assert [a.status for a in state.branches["main"].attempts["slow"]] == ["succeeded"]  # not repeated
    assert state.branches["main"].attempts["after"][0].status == "succeeded"
    await assert_refold_identical(event_log, state)
