"""Executor partitions (docs/architecture.md, "Executor partitions").

With ``REEL_PARTITIONS`` N the commands stream maps a keyed start/resume to its run's partition (the
server's ``{{partition(N,1)}}``), each partition has its own durable, and an executor consumes its own
partitions, the shared durable of plain commands, and any partition no live executor owns. On a real
server: runs go to their partition's owner; a plain ``reel.cmd.start`` still runs; a keyed command naming
another run is refused; an owner killed with SIGKILL mid-run has its partition adopted and its run taken
over through JetStream redelivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from reel.services.executor.app import serve
from reel.services.executor.attempts import CRASH_ENV
from reel.shared.core.run.events import RunStarted
from reel.shared.core.run.ids import run_id_for_key
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.commands import Reply, ResumeRun, StartRun, encode
from reel.shared.core.wire.subjects import REPLY_TO_HEADER, Names, partition_of
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra, connect, ensure_infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running

N = 2


def keys_in(partition: int, count: int, tag: str) -> list[str]:
    """``count`` idempotency keys whose runs fall in ``partition`` of N."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        key = f"{tag}-{i}"
        if partition_of(run_id_for_key(key), N) == partition:
            out.append(key)
        i += 1
    return out


WORKFLOW = parse_workflow({"name": "parts", "steps": [
    {"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "ok"}},
    {"kind": "model", "id": "b", "model": {"adapter": "scripted", "outputs": ["b done"]}},
    {"kind": "tool", "id": "c", "tool": {"type": "recorded", "output": "ok"}}]})


@contextlib.asynccontextmanager
async def partitioned(nats_url: str) -> AsyncIterator[tuple[Config, Infra]]:
    cfg = Config(nats_url=nats_url, names=Names(f"t{uuid.uuid4().hex[:10]}", N), lease_ttl_s=1,
                 command_ack_wait_s=2)
    nc = await connect(cfg, name="reel-tests")
    try:
        yield cfg, await ensure_infra(nc, cfg)
    finally:
        await nc.close()


async def verifying(log: JetStreamEventLog, run_id: str, timeout_s: float = 60) -> RunState:
    async def wait() -> RunState:
        while True:
            state = await log.load(run_id)
            if state.status == "verifying":
                return state
            await asyncio.sleep(0.05)
    return await asyncio.wait_for(wait(), timeout_s)


async def lease_naming(infra: Infra, partition: int, timeout_s: float = 60) -> None:
    """Wait (a KV watch, no polling) until a live executor lease names ``partition``."""
    watcher = await infra.leases.watchall()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                entry = await watcher.updates(timeout=timeout_s)
                if entry is not None and entry.value and partition in json.loads(entry.value).get("partitions", ()):
                    return
    finally:
        await watcher.stop()


def claims(state_log: list[Any]) -> list[str]:
    return [e.executor_id for _, c in state_log for e in c.events if isinstance(e, RunStarted)]


async def test_runs_go_to_their_partitions_executor_and_plain_commands_still_run(nats_url: str) -> None:
    async with partitioned(nats_url) as (cfg, infra):
        log = JetStreamEventLog(infra.nc, cfg.names)
        client = ReelClient(infra.nc, cfg, JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket))
        owners = {0: "ex-part-0", 1: "ex-part-1"}
        async with running(serve, infra, replace(cfg, executor_partitions=(0,)), executor_id=owners[0]), \
                running(serve, infra, replace(cfg, executor_partitions=(1,)), executor_id=owners[1]):
            keys = {p: keys_in(p, 3, uuid.uuid4().hex[:6]) for p in owners}
            replies = await asyncio.gather(*(client.start(WORKFLOW, idempotency_key=k) for ks in keys.values()
                                             for k in ks))
            assert all(r.ok and r.created for r in replies), replies
            for p, ks in keys.items():
                for k in ks:
                    run_id = run_id_for_key(k)
                    await verifying(log, run_id)
                    assert claims(await log.read(run_id)) == [owners[p]], (p, k)
            for p in owners:  # each start went through its partition's own durable
                info = await infra.js.consumer_info(cfg.names.commands_stream,
                                                    cfg.names.consumer(cfg.names.partition_consumer(p)))
                assert info.delivered.consumer_seq == 3

            # a plain client: the unkeyed subject, any executor takes it from the shared durable
            inbox = infra.nc.new_inbox()
            sub = await infra.nc.subscribe(inbox, max_msgs=1)
            await infra.js.publish(cfg.names.command("start"), encode(StartRun(workflow=WORKFLOW,
                                                                               idempotency_key="plain-1")),
                                   headers={REPLY_TO_HEADER: inbox})
            reply = msgspec.json.decode((await sub.next_msg(timeout=30)).data, type=Reply)
            assert reply.ok and reply.run_id == run_id_for_key("plain-1")
            state = await verifying(log, reply.run_id)
            assert state.executor_id in owners.values()

            # a keyed command about another run than its subject names: refused, nothing committed
            other = run_id_for_key(keys[0][0])
            sub = await infra.nc.subscribe(inbox := infra.nc.new_inbox(), max_msgs=1)
            await infra.js.publish(cfg.names.run_command(run_id_for_key("mismatch"), "start"),
                                   encode(StartRun(workflow=WORKFLOW, idempotency_key="not-mismatch")),
                                   headers={REPLY_TO_HEADER: inbox})
            refused = msgspec.json.decode((await sub.next_msg(timeout=30)).data, type=Reply)
            assert not refused.ok and refused.error is not None and refused.error.code == "invalid_command"
            assert await log.head(run_id_for_key("not-mismatch")) is None
            sub = await infra.nc.subscribe(inbox := infra.nc.new_inbox(), max_msgs=1)
            await infra.js.publish(cfg.names.run_command(run_id_for_key("mismatch"), "resume"),
                                   encode(ResumeRun(run_id=other)), headers={REPLY_TO_HEADER: inbox})
            refused = msgspec.json.decode((await sub.next_msg(timeout=30)).data, type=Reply)
            assert not refused.ok and refused.error is not None and refused.error.code == "invalid_command"


async def test_a_killed_owners_partition_is_adopted_and_its_run_taken_over(nats_url: str, tmp_path: Path) -> None:
    async with partitioned(nats_url) as (cfg, infra):
        log = JetStreamEventLog(infra.nc, cfg.names)
        client = ReelClient(infra.nc, cfg, JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket))
        env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace,
               "REEL_PARTITIONS": str(N), "REEL_EXECUTOR_PARTITIONS": "1", "REEL_COMMAND_ACK_WAIT_S": "2",
               "REEL_LEASE_TTL_S": "1", CRASH_ENV: "b:1:after_output", "REEL_LOG_FORMAT": "json"}
        log_path = tmp_path / "executor-p1.log"
        key = keys_in(1, 1, uuid.uuid4().hex[:6])[0]
        run_id = run_id_for_key(key)
        with log_path.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.executor", env=env,
                                                        cwd=REPO, stderr=stderr)
            try:
                await lease_naming(infra, 1)  # the owner is up: the survivor will not adopt partition 1
                async with running(serve, infra, replace(cfg, executor_partitions=(0,)), executor_id="ex-survivor"):
                    reply = await client.start(WORKFLOW, idempotency_key=key, timeout_s=30)
                    assert reply.ok and reply.run_id == run_id
                    assert await asyncio.wait_for(proc.wait(), 60) == 137, log_path.read_text()[-2000:]
                    state = await verifying(log, run_id)  # only partition 1's durable holds its start: adopted
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        owners = claims(await log.read(run_id))
        assert len(owners) == 2 and owners[0] != "ex-survivor" and owners[1] == "ex-survivor"
        b = state.branches["main"].attempts["b"]
        assert [a.executor_id for a in b][-1] == "ex-survivor" and b[-1].status == "succeeded"
