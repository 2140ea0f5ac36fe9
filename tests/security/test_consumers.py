"""A client shapes no consumer of the service's: durable, named, filtered, pull, or push consumers aimed at a
control, command, lease or service-inbox subject are refused — by the role's permissions (named and durable
create subjects) or by the consumer gate (what the bare create subject carries). Tried as ``client`` and
``viewer``; afterwards no stream has a durable or a consumer delivering outside a client inbox, and nothing
arrived on the subjects they were aimed at.
"""

from __future__ import annotations

import json

import pytest

from reel.shared.auth.roles import CLIENT_ROLES, client_js_api_prefix
from reel.shared.nats.access import PermissionDenied
from tests.integration.authserver import connected, consumer_create, fails_fast, js_api
from tests.security.conftest import SecurityLedger, Suite
from tests.security.doors import VICTIM, Tap

pytestmark = pytest.mark.security


async def test_a_client_creates_no_durable_named_or_aimed_consumer(
        suite: Suite, security_ledger: SecurityLedger) -> None:
    n, op = suite.server.base.names, suite.server.operator
    aimed = [n.control(VICTIM), n.command("recover"), f"$KV.{n.lease_bucket}.x-1", "_INBOX_executor.abc"]
    tap = await Tap().on(suite, *aimed, n.control_all)
    problems = []
    for role in CLIENT_ROLES:
        async with connected(suite.server, role) as nc:
            js, p = nc.jetstream(prefix=client_js_api_prefix(n)), client_js_api_prefix(n)
            denied = {
                "a durable": js.add_consumer(n.events_stream, durable_name="mine"),
                "a named consumer": js.add_consumer(n.events_stream, name="mine"),
                "a named, filtered consumer": js.add_consumer(n.events_stream, name="mine",
                                                              filter_subject=n.events(VICTIM)),
                "a durable on the verdicts stream": js.add_consumer(n.verdicts_stream, durable_name="mine"),
                "a durable on the blob stream": js.add_consumer(f"OBJ_{n.blob_bucket}", durable_name="mine"),
                "the executor's durable": js.add_consumer(n.commands_stream, durable_name=n.consumer("executor")),
                "a consumer on the commands stream": js.add_consumer(n.commands_stream),
            }
            for what, attempt in denied.items():
                refused = isinstance(await fails_fast(attempt), PermissionDenied)
                security_ledger.record(f"{role} creates {what}", refused=refused, let_in=not refused)
                if not refused:
                    problems.append(f"{role}: {what}")
            gated = {f"a push consumer aimed at {subject}": consumer_create(
                n.events_stream, deliver_subject=subject, ack_policy="none") for subject in aimed}
            gated |= {
                "a push consumer on the blob stream aimed at a lease": consumer_create(
                    f"OBJ_{n.blob_bucket}", deliver_subject=f"$KV.{n.lease_bucket}.x-1", ack_policy="none"),
                "a durable in the body": consumer_create(
                    n.events_stream, durable_name="mine", deliver_subject=nc.new_inbox(), ack_policy="none"),
                "a filtered durable in the body": consumer_create(
                    n.verdicts_stream, durable_name="mine", filter_subject=n.verdict(VICTIM),
                    deliver_subject=nc.new_inbox(), ack_policy="none"),
                "explicit acks": consumer_create(n.events_stream, deliver_subject=nc.new_inbox(),
                                                 ack_policy="explicit"),
                "a pull consumer": consumer_create(n.events_stream, ack_policy="none"),
            }
            for what, body in gated.items():
                stream = json.loads(body)["stream_name"]
                answer = await js_api(nc, f"{p}.CONSUMER.CREATE.{stream}", body)
                refused = answer.get("error", {}).get("code") == 403
                security_ledger.record(f"{role} creates {what}", refused=refused, let_in=not refused)
                if not refused:
                    problems.append(f"{role}: {what}: {answer}")
    arrived = await tap.close(suite)
    persisted = [f"{stream}: {info.name} -> {info.config.deliver_subject}"
                 for stream in (n.events_stream, n.verdicts_stream, f"OBJ_{n.blob_bucket}")
                 for info in await op.js.consumers_info(stream)  # the services' own deliver to their inboxes
                 if info.name == "mine" or info.config.durable_name == "mine" or info.config.deliver_subject in aimed]
    security_ledger.record("a refused consumer persisted or delivered", refused=not (persisted or arrived),
                           let_in=bool(persisted or arrived))
    assert not problems, problems
    assert persisted == [] and arrived == [], (persisted, arrived)
