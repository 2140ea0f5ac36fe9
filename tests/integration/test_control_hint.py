"""A control message is a hint: the executor stops an attempt only for a cancel its run's log holds
(shared/nats/control.py). Real nats-server, real executor and cancel service, a real async Python tool
that blocks until stopped; no mocks, no sleeps to sync (the executor's own log lines are the rendezvous).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from reel.services.cancel.app import serve as cancel_serve
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.control import publish_control
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration import cancel_support as cs
from tests.integration.scenarios import attempt_of, wait_until
from tests.logcapture import info_logs

BOUND_S = 5.0
WAIT_S = 30.0


@pytest.fixture
async def services(infra: Infra, cfg: Config, executor: None) -> AsyncIterator[None]:
    async with running(cancel_serve, infra, cfg):
        yield


def _blocking_agent(token: str) -> dict[str, object]:
    tool = {"name": "wait", "python": "tests.integration.cancel_support:wait_forever", "timeout_s": 60,
            "parameters": {"type": "object", "properties": {"token": {"type": "string"}}}}
    scripted = {"adapter": "scripted", "turns": [{"tool_calls": [{"name": "wait", "arguments": {"token": token}}]},
                                                 {"text": "done"}]}
    return {"name": "hint", "steps": [{"kind": "agent", "id": "solve", "instructions": "Work.", "max_turns": 3,
                                       "context": [{"id": "task", "kind": "task", "text": "wait"}],
                                       "model": scripted, "tools": [tool]}]}


async def test_a_forged_control_message_does_not_interrupt_an_attempt_and_a_real_cancel_does(
    services: None, infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog,
) -> None:
    gate = cs.arm()
    with info_logs() as logs:
        reply = await client.start(parse_workflow(_blocking_agent(gate.token)))
        assert reply.ok and reply.run_id
        run_id = reply.run_id
        await asyncio.wait_for(gate.started.wait(), WAIT_S)
        head = (await event_log.load(run_id)).head_lsn
        forged_lsns = [1, head, head + 1, 10**9]  # the run's own LSNs and beyond: none holds a cancel
        for n, lsn in enumerate(forged_lsns, 1):
            await publish_control(infra.nc, cfg.names, run_id, lsn)

            async def checked(n: int = n) -> bool:  # or it stopped the tool (what an unchecked signal does)
                return gate.stopped.is_set() or \
                    sum(1 for e in logs if e["event"] == "control.unconfirmed" and e["run_id"] == run_id) == n

            await wait_until(checked, timeout_s=WAIT_S, what=f"the executor to check forged signal {lsn} in the log")
            assert not gate.stopped.is_set(), f"a forged control message (LSN {lsn}) interrupted the attempt"
        state = await event_log.load(run_id)
        assert state.status == "running" and attempt_of(state, "solve:t1:c0", 1).status == "dispatched"

        started = time.monotonic()
        cancelled = await client.cancel(run_id, "user pressed stop")
        assert cancelled.ok and cancelled.status == "cancelled"
        await asyncio.wait_for(gate.stopped.wait(), BOUND_S)  # the real one stops it
        assert gate.stopped_at - started < BOUND_S
    assert any(e["event"] == "control.cancel_found_in_log" and e["run_id"] == run_id for e in logs)

    async def recorded() -> bool:
        return attempt_of(await event_log.load(run_id), "solve:t1:c0", 1).status == "cancelled"

    await wait_until(recorded, timeout_s=WAIT_S, what="the attempt recorded cancelled")
