"""Hostile input on every command subject: forged bodies, hostile run and step ids, JSON nested 10,000 deep.

The bodies are the trust tests' table (tests/support/payloads.py: garbage, wrong types, ~900 KB, unicode
ids — emoji, right-to-left, NUL, lone surrogates, not one subject token — and :data:`DEEP`). The client
sends each to every command subject it may publish on; the operator sends each to the ones only services
and operators may (``resume``, ``recover``). Every one gets a refusal reply naming a code (the deep ones
``invalid_command: nested deeper than …``), and no service log line holds a traceback or a crashed handler.
"""

from __future__ import annotations

import asyncio

import pytest

from reel.shared.auth.roles import CLIENT_COMMANDS
from reel.shared.core.wire.commands import Reply
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import Infra, open_infra
from tests.security.conftest import SecurityLedger, Suite
from tests.support.payloads import DEEP, ask, hostile

pytestmark = pytest.mark.security

OPERATOR_COMMANDS = ("resume", "recover")
"""Command subjects a client may not publish on (its doors: test_doors.py) whose services must refuse too."""


def _subject(suite: Suite, command: str) -> str:
    n = suite.server.base.names
    return n.command(command)


def _refusal(reply: Reply, body: bytes) -> str | None:
    """What is wrong with ``reply`` as the refusal of ``body`` (None: a clear refusal)."""
    if reply.ok or reply.error is None or not reply.error.code or not reply.error.message:
        return f"not a refusal: {reply}"
    if body in DEEP and "nested deeper than" not in reply.error.message:
        return f"a deep body refused as {reply.error.code}: {reply.error.message[:120]}"
    return None


async def _send_all(infra: Infra, subject: str, bodies: list[bytes]) -> list[Reply | BaseException]:
    return await asyncio.gather(*(ask(infra, subject, b, timeout_s=30) for b in bodies), return_exceptions=True)


async def test_hostile_bodies_and_deep_json_on_every_command_subject_get_a_refusal_and_no_traceback(
        suite: Suite, client: ReelClient, security_ledger: SecurityLedger) -> None:
    live = await client.start(parse_workflow({"name": "live", "steps": [
        {"kind": "tool", "id": "say", "tool": {"type": "scripted", "outputs": ["hi"]}}]}))
    assert live.ok and live.run_id, live
    bodies = hostile([live.run_id])
    assert all(b in bodies for b in DEEP)
    mark = len(suite.logs.lines())
    as_client = await open_infra(client.nc, suite.server.cfg("client"))
    senders = [(c, as_client, "client") for c in CLIENT_COMMANDS] + \
        [(c, suite.server.operator, "operator") for c in OPERATOR_COMMANDS]
    problems = []
    for command, infra, who in senders:
        subject = _subject(suite, command)
        answers = await _send_all(infra, subject, bodies)
        for i, (body, answer) in enumerate(zip(bodies, answers, strict=True)):
            wrong = _refusal(answer, body) if isinstance(answer, Reply) else f"no reply: {answer!r}"
            kind = "deep JSON" if body in DEEP else "hostile body"
            security_ledger.record(f"{who}: {kind} #{i} on {command}", refused=wrong is None, let_in=wrong is not None)
            if wrong:
                problems.append(f"{command} {body[:60]!r}: {wrong}")
    crashed = [line for line in suite.logs.lines()[mark:]
               if line.get("event") == "command.handler_crashed" or "exception" in line
               or "Traceback" in str(line) or "RecursionError" in str(line)]
    security_ledger.record("a traceback in the services' logs", refused=not crashed, let_in=bool(crashed))
    assert not problems, "\n".join(problems[:40])
    assert crashed == [], crashed[:3]
    state = await client.wait_for(live.run_id, ("completed",), timeout_s=60)  # the live run it named is untouched
    assert state.outcome in ("succeeded", "passed") and len(state.branches) == 1, state
