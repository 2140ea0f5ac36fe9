"""Direct publishes and JetStream API requests a client-account user must not make, door by door.

The doors come from the role grants (tests/security/doors.py), so a subject added to any grant is
tried here without editing this test: every command, event, verdict, verification-trigger, control,
lease, outcome and snapshot subject the role may not write, every JetStream admin verb (stream
create/update/delete/purge/snapshot, message delete, consumer create/delete, pulls) on every stream.
Each must be refused at once with :class:`PermissionDenied`; afterwards no stream holds one message
more and no control message arrived. Then the forged reply subjects: requests whose reply (or
``Reel-Reply-To``) names an event, control or command subject write nothing there.
"""

from __future__ import annotations

import asyncio

import pytest

from reel.shared.auth.roles import CLIENT_COMMANDS, CLIENT_ROLES, client_js_api_prefix
from reel.shared.core.wire.commands import CancelRun, encode
from reel.shared.core.wire.subjects import REPLY_TO_HEADER
from reel.shared.nats.access import PermissionDenied, ReelConnection
from reel.shared.nats.client import ReelClient
from tests.integration.authserver import connected
from tests.security.conftest import SecurityLedger, Suite
from tests.security.doors import VICTIM, Tap, counts, doors, must_stay_shut, writable

pytestmark = pytest.mark.security

PROBE_TIMEOUT_S = 2.0
async def probe(nc: ReelConnection, subject: str) -> BaseException | None:
    """Publish a request on ``subject``; what came back (``PermissionDenied`` when refused, None for an answer)."""
    try:
        await nc.request(subject, b"{}", timeout=PROBE_TIMEOUT_S)
    except Exception as exc:  # PermissionDenied, or no responders / a timeout: it went through
        return exc
    return None


async def test_every_door_the_grants_deny_a_client_account_user_is_shut(
        suite: Suite, security_ledger: SecurityLedger) -> None:
    n = suite.server.base.names
    tap = await Tap().on(suite, *writable(suite))
    before = await counts(suite)
    open_doors: list[str] = []
    for role in CLIENT_ROLES:
        tried = doors(n, role)
        assert set(must_stay_shut(n)) <= set(tried), sorted(set(must_stay_shut(n)) - set(tried))  # a grant opened one
        if role == "viewer":  # the viewer may not send commands: each is among its doors
            assert {n.command(c) for c in CLIENT_COMMANDS} <= set(tried)
        async with connected(suite.server, role) as nc:
            for subject in tried:
                got = await probe(nc, subject)
                refused = isinstance(got, PermissionDenied)
                security_ledger.record(f"{role} publishes {subject}", refused=refused, let_in=not refused)
                if not refused:
                    open_doors.append(f"{role} {subject}: {got!r}")
    arrived = await tap.close(suite)
    after = await counts(suite)
    security_ledger.record("doors: a stream changed", refused=after == before, let_in=after != before)
    security_ledger.record("doors: a command, event or signal arrived", refused=not arrived, let_in=bool(arrived))
    assert not open_doors, "\n".join(open_doors)
    assert after == before and arrived == []


async def test_the_viewer_may_not_send_commands(suite: Suite, security_ledger: SecurityLedger) -> None:
    n = suite.server.base.names
    async with connected(suite.server, "viewer") as nc:
        js = nc.jetstream(prefix=client_js_api_prefix(n))
        for command in CLIENT_COMMANDS:
            exc: BaseException | None = None
            try:
                await asyncio.wait_for(js.publish(n.command(command), encode(CancelRun(run_id=VICTIM))), 5)
            except Exception as e:
                exc = e
            refused = isinstance(exc, PermissionDenied)
            security_ledger.record(f"viewer sends a {command} command", refused=refused, let_in=exc is None)
            assert refused, (command, exc)


async def test_forged_reply_subjects_write_nothing(
        suite: Suite, client: ReelClient, security_ledger: SecurityLedger) -> None:
    n, p = suite.server.base.names, client_js_api_prefix(suite.server.base.names)
    targets = [n.events(VICTIM), n.control(VICTIM), n.command("recover"), n.command("resume"), n.verdict(VICTIM),
               f"$KV.{n.outcome_bucket}.{VICTIM}.main.work.1"]
    tap = await Tap().on(suite, *targets)
    before = await counts(suite)
    requests = [(n.command("start"), b"{}"), (n.command("cancel"), encode(CancelRun(run_id=VICTIM))),
                (f"$JS.API.DIRECT.GET.{n.events_stream}", b'{"seq": 1}'),
                (f"{p}.STREAM.INFO.{n.events_stream}", b""), (f"{p}.CONSUMER.CREATE.{n.events_stream}", b"{}")]
    for target in targets:
        for subject, body in requests:
            await client.nc.publish(subject, body, reply=target)
        await client.js.publish(n.command("cancel"), encode(CancelRun(run_id=VICTIM)),
                                headers={REPLY_TO_HEADER: target})
    for subject, body in requests:  # rendezvous: the same requests answered to the client itself, after
        await client.nc.request(subject, body, timeout=10)
    inbox = client.nc.new_inbox()
    answers = await client.nc.subscribe(inbox, max_msgs=1)
    await client.js.publish(n.command("cancel"), encode(CancelRun(run_id=VICTIM)), headers={REPLY_TO_HEADER: inbox})
    await answers.next_msg(timeout=10)  # the cancel service answered every forged one before this
    arrived = await tap.close(suite)
    after = await counts(suite)
    for target in targets:
        got = [s for s in arrived if s == target]
        security_ledger.record(f"forged reply subject {target}", refused=not got, let_in=bool(got))
    assert arrived == [], arrived
    assert after == before, (before, after)
