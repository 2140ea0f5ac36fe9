"""Consumers only the services shape, tried door by door on a real auth-on server (docs/security.md).

A client (and the read-only viewer) may create only an ephemeral ack-none consumer delivering to its
own inbox, on the bare ``CONSUMER.CREATE.<stream>`` under its JetStream API prefix, vetted by the
consumer gate the mutator services run (shared/nats/consumergate.py). Every other consumer — durable,
named, aimed at a service subject, pulling, on the commands stream — is refused, and nothing of a
refused request reaches a stream or a service's subscription.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from reel.shared.auth.roles import CLIENT_ROLES, client_js_api_prefix
from reel.shared.core.wire.commands import CancelRun, encode
from reel.shared.nats.access import PermissionDenied
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.infra import MAX_COMMAND_CONSUMERS, MAX_CONSUMERS, open_infra
from reel.shared.nats.micro import discover
from tests.integration.authserver import (
    AuthServer,
    auth_server,
    connected,
    consumer_create,
    fails_fast,
    gate_up,
    js_api,
    services_as_roles,
)


@pytest.fixture
async def server(tmp_path: Path) -> AuthServer:  # type: ignore[misc]
    async with auth_server(tmp_path) as srv:
        yield srv


async def test_each_consumer_door_on_a_real_server(server: AuthServer) -> None:
    n, op = server.base.names, server.operator
    await op.js.publish(n.events("r-door"), b"{}")
    aimed: list[str] = []

    async def on_aimed(msg: Msg) -> None:
        aimed.append(msg.subject)

    watch = await op.nc.subscribe(n.control_all, cb=on_aimed)  # where a forged signal would arrive
    commands_before = (await op.js.stream_info(n.commands_stream)).state.messages
    refused = 0
    async with services_as_roles(server, "cancel"):
        await gate_up(server)
        for role in CLIENT_ROLES:
            async with connected(server, role) as nc:
                js, p = nc.jetstream(prefix=client_js_api_prefix(n)), client_js_api_prefix(n)
                denied = {
                    "a durable (legacy subject)": js.add_consumer(n.events_stream, durable_name="mine"),
                    "a named consumer": js.add_consumer(n.events_stream, name="mine"),
                    "a named consumer with a filter": js.add_consumer(
                        n.events_stream, name="mine", filter_subject=n.events("r-door")),
                    "a durable, named": js.add_consumer(n.events_stream, name="mine", durable_name="mine"),
                    "a consumer on the commands stream": js.add_consumer(n.commands_stream),
                }
                for what, attempt in denied.items():
                    assert isinstance(await fails_fast(attempt), PermissionDenied), (role, what)
                    refused += 1
                gated = {
                    "aimed at the executor's control subject": consumer_create(
                        n.events_stream, deliver_subject=n.control("r-door"), ack_policy="none"),
                    "aimed at the recover command": consumer_create(
                        n.events_stream, deliver_subject=n.command("recover"), ack_policy="none"),
                    "aimed at a lease": consumer_create(
                        f"OBJ_{n.blob_bucket}", deliver_subject=f"$KV.{n.lease_bucket}.x-1", ack_policy="none"),
                    "aimed at a service's inbox": consumer_create(
                        n.verdicts_stream, deliver_subject="_INBOX_executor.abc", ack_policy="none"),
                    "aimed at a pending request's inbox": consumer_create(
                        n.events_stream, deliver_subject="_INBOX.abc.def", ack_policy="none"),
                    "a durable in the body": consumer_create(
                        n.events_stream, durable_name="mine", deliver_subject=nc.new_inbox(), ack_policy="none"),
                    "a name in the body": consumer_create(
                        n.events_stream, name="mine", deliver_subject=nc.new_inbox(), ack_policy="none"),
                    "explicit acks": consumer_create(
                        n.events_stream, deliver_subject=nc.new_inbox(), ack_policy="explicit"),
                    "a pull consumer": consumer_create(n.events_stream, ack_policy="none"),
                    "another stream in the body": consumer_create(
                        n.commands_stream, deliver_subject=nc.new_inbox(), ack_policy="none"),
                }
                for what, body in gated.items():
                    stream = json.loads(body)["stream_name"]
                    if stream == n.commands_stream:
                        stream = n.events_stream  # the subject names the events stream, the body another
                    answer = await js_api(nc, f"{p}.CONSUMER.CREATE.{stream}", body)
                    assert answer.get("error", {}).get("code") == 403, (role, what, answer)
                    assert "consumer_refused" in answer["error"]["description"], (role, what)
                    refused += 1
                for what, body in {"deep JSON": b'{"config":' * 5000 + b"{}" + b"}" * 5000,
                                   "a huge request": b" " * 20_000 + b"{}"}.items():
                    answer = await js_api(nc, f"{p}.CONSUMER.CREATE.{n.events_stream}", body)
                    assert answer.get("error", {}).get("code") == 403, (role, what, answer)
                    assert "consumer_refused" in answer["error"]["description"], (role, what)
                    refused += 1
                # what a client does use: an ordered consumer into its inbox (nats-py), on the bare subject
                sub = await js.subscribe(n.events("r-door"), ordered_consumer=True)
                msg = await sub.next_msg(timeout=5)
                assert msg.data == b"{}"
                await sub.unsubscribe()
                assert await discover(nc, "PING", name="reel-cancel", timeout_s=0.3, expected=1), role  # $SRV open
    for stream in (n.events_stream, n.verdicts_stream, f"OBJ_{n.blob_bucket}"):  # none was created: none delivers
        for info in await op.js.consumers_info(stream):
            assert info.name != "mine" and info.config.durable_name is None, info
            assert info.config.deliver_subject is None or info.config.deliver_subject.startswith("_INBOX."), info
    await watch.unsubscribe()
    assert aimed == []
    assert (await op.js.stream_info(n.commands_stream)).state.messages == commands_before
    assert refused == 2 * (5 + 10 + 2)


async def test_a_client_reads_a_multi_chunk_blob_through_the_gate(server: AuthServer) -> None:
    """nats-py's object-store read of several chunks is an ordered consumer: the gate admits it."""
    body = bytes(range(256)) * 5000  # 1.28 MB: three chunks
    ref = await JetStreamBlobStore(server.operator.nc, server.operator.blobs, server.base.names.blob_bucket).put(body)
    async with services_as_roles(server, "cancel"):
        await gate_up(server)
        for role in CLIENT_ROLES:
            async with connected(server, role) as nc:
                infra = await open_infra(nc, server.cfg(role))
                store = JetStreamBlobStore(nc, infra.blobs, server.base.names.blob_bucket)
                assert await store.get(ref) == body, role


async def test_a_viewer_sends_no_command_and_writes_no_blob(server: AuthServer) -> None:
    n = server.base.names
    async with connected(server, "viewer") as nc:
        js = nc.jetstream(prefix=client_js_api_prefix(n))
        for attempt in (js.publish(n.command("cancel"), encode(CancelRun(run_id="r-1"))),
                        js.publish(n.command("start"), b"{}"),
                        js.publish(f"$O.{n.blob_bucket}.C.abc", b"x")):
            assert isinstance(await fails_fast(attempt), PermissionDenied)
        assert (await js.stream_info(n.events_stream)).config.name == n.events_stream  # it reads


async def test_every_stream_and_bucket_caps_its_consumers(server: AuthServer) -> None:
    n, js = server.base.names, server.operator.js
    caps = {n.events_stream: MAX_CONSUMERS, n.verdicts_stream: MAX_CONSUMERS,
            n.commands_stream: MAX_COMMAND_CONSUMERS + n.partitions, f"OBJ_{n.blob_bucket}": MAX_CONSUMERS,
            **{f"KV_{b}": MAX_CONSUMERS for b in (n.lease_bucket, n.outcome_bucket, n.snapshot_bucket)}}
    for stream, cap in caps.items():
        assert (await js.stream_info(stream)).config.max_consumers == cap, stream
