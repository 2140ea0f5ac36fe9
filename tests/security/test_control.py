"""A forged control message does not interrupt an attempt: the executor reads the run's log first.

The client cannot publish on ``<ns>.ctl.<run>`` (its doors: test_doors.py) nor aim a consumer there
(test_consumers.py); this attack assumes a signal arrives anyway (published here by the operator, the way a
consumer aimed at the subject once delivered one) for LSNs at, before and beyond the run's head. The
executor checks each against the log (``control.unconfirmed``), the attempt in flight is not interrupted and
completes normally once the tool returns.
"""

from __future__ import annotations

import asyncio

import pytest

from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.access import PermissionDenied
from reel.shared.nats.client import ReelClient
from reel.shared.nats.control import publish_control
from tests.integration.authserver import fails_fast
from tests.integration.scenarios import attempt_of, wait_until
from tests.security import gated
from tests.security.conftest import SecurityLedger, Suite

pytestmark = pytest.mark.security

WAIT_S = 30.0


def _gated_agent(token: str) -> dict[str, object]:
    tool = {"name": "wait", "python": "tests.security.gated:until_released", "timeout_s": 60,
            "parameters": {"type": "object", "properties": {"token": {"type": "string"}}}}
    scripted = {"adapter": "scripted", "turns": [{"tool_calls": [{"name": "wait", "arguments": {"token": token}}]},
                                                 {"text": "done"}]}
    return {"name": "forged-signal", "steps": [{"kind": "agent", "id": "solve", "instructions": "Work.",
                                                "max_turns": 3, "model": scripted, "tools": [tool],
                                                "context": [{"id": "task", "kind": "task", "text": "wait"}]}]}


async def test_a_forged_control_message_does_not_interrupt_an_attempt_in_flight(
        suite: Suite, client: ReelClient, security_ledger: SecurityLedger) -> None:
    n, op = suite.server.base.names, suite.server.operator
    gate = gated.arm()
    reply = await client.start(parse_workflow(_gated_agent(gate.token)))
    assert reply.ok and reply.run_id, reply
    run_id = reply.run_id
    await asyncio.wait_for(gate.started.wait(), WAIT_S)
    exc = await fails_fast(client.nc.request(n.control(run_id), b"{}", timeout=2))
    security_ledger.record("client publishes on the control subject", refused=isinstance(exc, PermissionDenied),
                           let_in=not isinstance(exc, PermissionDenied))
    assert isinstance(exc, PermissionDenied), exc
    head = (await client.log.load(run_id)).head_lsn
    for k, lsn in enumerate([1, head, head + 1, 10**9], 1):
        await publish_control(op.nc, n, run_id, lsn)

        async def checked(k: int = k) -> bool:  # or it stopped the tool (what an unchecked signal does)
            return gate.interrupted.is_set() or k == sum(
                1 for e in suite.logs.lines() if e.get("event") == "control.unconfirmed" and e.get("run_id") == run_id)

        await wait_until(checked, timeout_s=WAIT_S, what=f"the executor to check forged signal {lsn} in the log")
        security_ledger.record(f"forged control message at LSN {'head' if lsn == head else lsn}",
                               refused=not gate.interrupted.is_set(), let_in=gate.interrupted.is_set())
        assert not gate.interrupted.is_set(), f"a forged control message (LSN {lsn}) interrupted the attempt"
    gate.release.set()
    state = await client.wait_for(run_id, ("completed", "cancelled"), timeout_s=WAIT_S)
    assert state.status == "completed" and attempt_of(state, "solve:t1:c0", 1).status == "succeeded", state.status
