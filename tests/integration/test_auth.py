"""Least-privilege NATS roles on a real auth-on server (docs/security.md).

The server runs with the accounts ``reel auth init`` writes (tests/integration/authserver.py).
A ``client`` connection cannot write history or administer JetStream — each refusal an
immediate :class:`PermissionDenied`, never a hang — and the services, each connected
as its own role, run real runs end to end for a client that starts, cancels, rewinds
and reads them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
from nats.aio.msg import Msg
from nats.js import api as jsapi

from reel.shared.auth.roles import client_js_api_prefix
from reel.shared.core.run.events import Verdict
from reel.shared.core.wire.commands import CancelRun, RecoverRuns, ResumeRun, encode
from reel.shared.core.wire.livemessages import StreamChunk, decode_chunk
from reel.shared.core.wire.subjects import REPLY_TO_HEADER
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.access import PermissionDenied
from reel.shared.nats.client import INLINE_WORKFLOW_MAX_BYTES, ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import open_infra
from tests.integration.authserver import (
    AuthServer,
    auth_server,
    client_of,
    connected,
    fails_fast,
    services_as_roles,
)
from tests.integration.scenarios import STEP, attempt_of, crash_executor_mid_attempt, wait_state, wait_until
from tests.logcapture import info_logs
from tests.support.chat_server import ChatServer, streamed


@pytest.fixture
async def server(tmp_path: Path) -> AuthServer:  # type: ignore[misc]
    async with auth_server(tmp_path) as srv:
        yield srv


async def test_a_client_cannot_write_history_or_administer_jetstream(server: AuthServer) -> None:
    n = server.base.names
    async with connected(server, "client") as nc:
        js = nc.jetstream()
        await open_infra(nc, server.cfg("client"))  # it can see the streams
        refused = {
            "an event": js.publish(n.events("r-victim"), b'{"forged": true}'),
            "a verdict": js.publish(n.verdict("r-victim"), b"{}"),
            "a lease": js.publish(f"$KV.{n.lease_bucket}.e-1", b"{}"),
            "an outcome marker": js.publish(f"$KV.{n.outcome_bucket}.r.main.s.1", b"{}"),
            "a snapshot": js.publish(f"$KV.{n.snapshot_bucket}.r-victim", b"{}"),
            "a resume": js.publish(n.command("resume"), encode(ResumeRun(run_id="r-victim"))),
            "a recover": js.publish(n.command("recover"), encode(RecoverRuns())),
            "stream create": js.add_stream(jsapi.StreamConfig(name="EVIL", subjects=["evil.>"])),
            "stream update": js.update_stream(jsapi.StreamConfig(name=n.events_stream, subjects=[n.events_all],
                                                                 max_msgs=1)),
            "stream delete": js.delete_stream(n.events_stream),
            "stream purge": js.purge_stream(n.events_stream),
            "message delete": js.delete_msg(n.events_stream, 1),
            "the executor's durable": js.add_consumer(n.commands_stream, durable_name=n.consumer("executor")),
            "the executor's durable, named": js.add_consumer(
                n.commands_stream, name=n.consumer("executor"), durable_name=n.consumer("executor")),
            "the verifier's durable": js.add_consumer(
                n.events_stream, name=n.consumer("verifier"), durable_name=n.consumer("verifier"),
                filter_subject=n.events_all),
            "pulling commands": nc.request(
                f"{client_js_api_prefix(n)}.CONSUMER.MSG.NEXT.{n.commands_stream}.{n.consumer('executor')}", b"1"),
            "a consumer delete": js.delete_consumer(n.events_stream, n.consumer("verifier")),
            "the plain admin API": nc.request(f"$JS.API.STREAM.DELETE.{n.events_stream}", b""),
        }
        kv = await js.key_value(n.lease_bucket)  # reading is allowed, writing is not
        refused["a KV put"] = kv.put("e-1", b"{}")
        for what, call in refused.items():
            exc = await fails_fast(call)
            assert isinstance(exc, PermissionDenied), (what, exc)
            assert "client" in exc.message, exc.message
        assert len(nc.violations) >= len(refused)

        # a reply subject is never a way in: JetStream's answers to the client's requests stay in its account
        before = (await server.operator.js.stream_info(n.events_stream)).state.messages
        requests = [(n.command("start"), b"{}"), (f"$JS.API.DIRECT.GET.{n.events_stream}", b'{"seq": 1}'),
                    (f"{client_js_api_prefix(n)}.STREAM.INFO.{n.events_stream}", b"")]
        for subject, body in requests:
            await nc.publish(subject, body, reply=n.events("r-victim"))
        for subject, body in requests:  # rendezvous: the same requests answered to the client itself
            await nc.request(subject, body, timeout=5)
        probe = await server.operator.js.publish(n.events("r-probe"), b"{}")  # ordered after the client's
        after = (await server.operator.js.stream_info(n.events_stream)).state.messages
        assert after == before + 1 and probe.seq == after, "a reply landed on an event subject"


def _workflow(name: str, *, big: bool = False) -> dict[str, object]:
    notes = "n" * (INLINE_WORKFLOW_MAX_BYTES + 1024) if big else "notes"  # big: the client stores it as a blob
    return {"name": name, "labels": {"notes": notes}, "steps": [
        {"kind": "tool", "id": "plan", "tool": {"type": "scripted", "outputs": ["plan: say hello"]}},
        {"kind": "tool", "id": "say", "tool": {"type": "scripted", "outputs": ["hello world", "hello again"]}},
    ], "verifiers": [{"type": "output_regex", "pattern": "hello"}]}


async def test_services_as_their_roles_run_what_a_client_starts_cancels_and_rewinds(
    server: AuthServer, tmp_path: Path
) -> None:
    n = server.base.names
    started, gate = tmp_path / "started", tmp_path / "gate"
    gated = parse_workflow({"name": "gated", "steps": [{"kind": "tool", "id": "slow", "tool": {
        "type": "command", "argv": ["sh", "-c", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done"]}}]})
    with info_logs() as logs:
        async with services_as_roles(server, "executor", "verifier", "rewind", "cancel"), \
                client_of(server) as client:
            # start (inline and, for a big workflow, by a blob the client stores), run, verify
            runs = []
            for spec in (parse_workflow(_workflow("small")), parse_workflow(_workflow("big", big=True))):
                reply = await client.start(spec, timeout_s=30)
                assert reply.ok and reply.run_id, reply
                runs.append(reply.run_id)
            for run in runs:
                state = await client.wait_for(run, ("completed",), timeout_s=60)
                assert state.outcome == "passed", state
            assert set(runs) <= set(await client.log.list_runs())
            assert [v.status for v in await client.verdicts(runs[0])] == ["pass"]
            sub = await client.js.subscribe(n.verdict(runs[0]), ordered_consumer=True)  # the verdict stream
            seen = msgspec.json.decode((await sub.next_msg(timeout=10)).data, type=Verdict)
            await sub.unsubscribe()
            assert (seen.run_id, seen.status) == (runs[0], "pass")

            # rewind: a new branch, run and verified again
            rewound = await client.rewind(runs[0], at_step="say", idempotency_key="again")
            assert rewound.ok and rewound.branch_id, rewound
            state = await client.wait_for(runs[0], ("completed",), timeout_s=60)
            assert state.active_branch == rewound.branch_id and len(state.verdicts) == 2

            # cancel a run in flight
            reply = await client.start(gated, timeout_s=30)
            assert reply.run_id
            await wait_until(lambda: asyncio.to_thread(started.exists), timeout_s=30, what="the gated tool")
            cancelled = await client.cancel(reply.run_id, "from a client")
            assert cancelled.ok and cancelled.status == "cancelled", cancelled
            # the cancel service (mutators) signals the executor: the tool is stopped, its attempt cancelled
            state = await wait_state(client.log, reply.run_id,
                                     lambda s: attempt_of(s, "slow", 1).status != "dispatched",
                                     what="the gated attempt to be recorded")
            assert attempt_of(state, "slow", 1).status == "cancelled"
            gate.touch()

            # a Reel-Reply-To naming a run's event subject: the service does not write there
            head = await client.log.head(runs[0])
            inbox = client.nc.new_inbox()
            answers = await client.nc.subscribe(inbox)
            await client.js.publish(n.command("cancel"), encode(CancelRun(run_id=runs[0])),
                                    headers={REPLY_TO_HEADER: n.events(runs[0])})
            await client.js.publish(n.command("cancel"), encode(CancelRun(run_id=runs[0])),
                                    headers={REPLY_TO_HEADER: inbox})
            assert json.loads((await answers.next_msg(timeout=10)).data)["ok"]  # the second: after the first
            assert await client.log.head(runs[0]) == head
    assert any(line["event"] == "command.reply_refused" for line in logs)
    denied = [line for line in logs if line["event"] == "nats.permission_denied"]
    assert denied == [], f"a service's role lacks a permission it uses: {denied}"


async def test_a_client_receives_the_streamed_tokens_of_a_run_it_started(server: AuthServer,
                                                                          chat_server: ChatServer) -> None:
    chat_server.script(streamed("Streamed across the accounts.", chunks=8))
    spec = parse_workflow({"name": "streamed", "steps": [{"kind": "model", "id": "say", "context": [
        {"id": "task", "text": "say it"}], "model": {"adapter": "openai", "base_url": chat_server.url,
                                                    "model": "loopback-1", "timeout_s": 10, "stream": True}}]})
    with info_logs() as logs:
        async with services_as_roles(server, "executor"), client_of(server) as client:
            chunks: list[StreamChunk] = []
            done = asyncio.Event()

            async def on_msg(msg: Msg) -> None:
                chunks.append(decode_chunk(msg.data))
                if chunks[-1].done:
                    done.set()

            sub = await client.nc.subscribe(f"{server.base.names.namespace}.stream.>", cb=on_msg)  # its import
            await client.nc.flush()
            reply = await client.start(spec, timeout_s=30)
            assert reply.ok and reply.run_id
            await asyncio.wait_for(done.wait(), 30)
            await sub.unsubscribe()
    assert "".join(c.content for c in chunks) == "Streamed across the accounts." and chunks[-1].finish_reason
    denied = [line for line in logs if line["event"] == "nats.permission_denied"]
    assert denied == [], f"a role lacks a permission it uses: {denied}"


async def test_the_ui_reads_a_run_s_streamed_tokens_as_the_viewer_role(server: AuthServer,
                                                                       chat_server: ChatServer) -> None:
    """``reel ui``'s reader (:meth:`RunReader.tokens`, what ``/live?tokens=`` forwards) as the read-only viewer."""
    from reel.services.ui.reader import RunReader

    gate = asyncio.Event()
    chat_server.script(streamed("Streamed to the viewer.", chunks=8, gate=gate))
    spec = parse_workflow({"name": "streamed", "steps": [{"kind": "model", "id": "say", "context": [
        {"id": "task", "text": "say it"}], "model": {"adapter": "openai", "base_url": chat_server.url,
                                                    "model": "loopback-1", "timeout_s": 10, "stream": True}}]})
    with info_logs() as logs:
        async with services_as_roles(server, "executor"), client_of(server) as client, \
                connected(server, "viewer") as nc:
            reply = await client.start(spec, timeout_s=30)
            assert reply.ok and reply.run_id
            reader = RunReader(ReelClient(nc, server.cfg("viewer")))
            got = []
            async with reader.tokens([reply.run_id]) as queue:
                gate.set()  # subscribed (the reader flushed): the model streams from here on
                while not (got and got[-1].chunk.done):
                    got.append(await asyncio.wait_for(queue.get(), 30))
    assert "".join(c.chunk.content for c in got) == "Streamed to the viewer." and got[-1].chunk.finish_reason
    assert {(c.run_id, c.branch_id, c.step_id, c.attempt) for c in got} == {(reply.run_id, "main", "say", 1)}
    assert [c.chunk.seq for c in got] == list(range(len(got)))
    denied = [line for line in logs if line["event"] == "nats.permission_denied"]
    assert denied == [], f"a role lacks a permission it uses: {denied}"


async def test_recovery_as_mutators_resolves_the_attempt_of_an_executor_that_died(
    server: AuthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in server.dir.env("executor").items():  # the executor subprocess connects as its role
        monkeypatch.setenv(key, value)
    operator = ReelClient(server.operator.nc, server.cfg("operator"))  # `recover` is the operator's command

    async def recover(run_id: str) -> dict[str, object]:
        reply = await operator.command("recover", encode(RecoverRuns(run_id=run_id)), timeout_s=15)
        assert reply.ok, reply
        return reply.detail

    with info_logs() as logs:
        async with client_of(server) as client:
            run_id, dead = await crash_executor_mid_attempt(server.operator, server.base, client)
            async with services_as_roles(server, "recovery", options={"recovery": {"sweep": False}}):
                detail = await recover(run_id)
                assert detail["resolved"] == [] and detail["resumed"] == [run_id], detail
                async with services_as_roles(server, "executor"):  # the resume recovery queued
                    state = await wait_state(client.log, run_id, lambda s: s.status == "verifying",
                                             what="the resumed run to reach verifying")
                assert attempt_of(state, STEP, 3).status == "succeeded"
                assert attempt_of(state, STEP, 3).executor_id != dead
                detail = await recover(run_id)
            assert [(r["attempt"], r["outcome"]) for r in detail["resolved"]] == [(2, "succeeded")]  # type: ignore
            assert attempt_of(await client.log.load(run_id), STEP, 2).status == "succeeded"
    denied = [line for line in logs if line["event"] == "nats.permission_denied"]
    assert denied == [], f"a service's role lacks a permission it uses: {denied}"


async def test_the_crucible_service_as_its_role_runs_a_session_a_client_asks_for(
    server: AuthServer, tmp_path: Path
) -> None:
    from reel.services.crucible.app import RunSession
    from reel.services.crucible.sessionlog import SessionLog
    from reel.shared.core.wire.commands import Reply
    from reel.shared.crucible.names import CrucibleNames
    from tests.crucible.fixtures import make_config, make_repo, write

    names = CrucibleNames(server.base.names)
    repo = await make_repo(tmp_path, "1")
    config = make_config(tmp_path, repo, [write(2), write(1)])
    with info_logs() as logs:
        async with services_as_roles(server, "crucible"), client_of(server) as client:
            inbox = client.nc.new_inbox()
            replies = await client.nc.subscribe(inbox)
            await client.js.publish(names.command("run"), msgspec.json.encode(RunSession(config=config,
                                    session_id="s-auth")), headers={REPLY_TO_HEADER: inbox})
            reply = msgspec.json.decode((await replies.next_msg(timeout=20)).data, type=Reply)
            assert reply.ok and reply.run_id == "s-auth", reply
            log = SessionLog(server.operator.nc, server.base)

            async def ended() -> bool:
                return await log.exists("s-auth") and (await log.load("s-auth")).ended is not None

            await wait_until(ended, timeout_s=60, what="the session to end")
    denied = [line for line in logs if line["event"] == "nats.permission_denied"]
    assert denied == [], f"the crucible role lacks a permission it uses: {denied}"


async def test_retention_as_its_role_drops_an_unpinned_finished_run_and_its_blobs(server: AuthServer) -> None:
    from reel.shared.core.run.retention import RetentionPolicy
    from reel.shared.nats.infra import ensure_infra
    from reel.shared.nats.retention import pin, stored_blobs, sweep
    from reel.shared.runtime.clock import now_ms

    n = server.base.names

    def workflow(word: str) -> WorkflowSpec:
        return parse_workflow({"name": word, "steps": [
            {"kind": "tool", "id": "say", "tool": {"type": "recorded", "output": word * 3000}}]})

    async with services_as_roles(server, "executor", "verifier"), client_of(server) as client:
        runs = []
        for word in ("a", "b"):
            reply = await client.start(workflow(word), timeout_s=30)
            assert reply.ok and reply.run_id, reply
            runs.append(reply.run_id)
            await client.wait_for(reply.run_id, ("completed",), timeout_s=60)
    await pin(server.operator, n, runs[1], by="ops")
    before = {b.sha256 for b, _ in await stored_blobs(server.operator, n)}
    async with connected(server, "retention") as nc:
        infra = await ensure_infra(nc, server.cfg("retention"))
        report = await sweep(infra, n, RetentionPolicy(keep_newest=0), now_ms=now_ms() + 1, grace_s=0.001)
        with pytest.raises(PermissionDenied):  # it purges; it never commits
            await infra.js.publish(n.events(runs[0]), b"{}")
    assert report.dropped == [runs[0]] and report.pinned == 1, report
    assert report.deleted >= 1, report  # the dropped run's output blob
    assert runs[0] not in await JetStreamEventLog(server.operator.nc, n).list_runs()
    assert runs[1] in await JetStreamEventLog(server.operator.nc, n).list_runs()
    after = {b.sha256 for b, _ in await stored_blobs(server.operator, n)}
    assert after < before and len(before - after) == report.deleted
