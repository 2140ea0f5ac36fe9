"""The JetStream event log's own layout and infrastructure on a real nats-server.

What every EventLog must do (fence, dedup, reads at an LSN, per-run read cost, snapshots) is
the contract suite, tests/integration/test_eventlog_contract.py; here: how JetStreamEventLog
lays commits out in the stream, and the streams ensure_infra creates. No mocks: every
assertion about "what is in the stream" asks the server (stream info, raw message get).
"""

from __future__ import annotations

import asyncio

from nats.js import api as jsapi

from reel.shared.core.run.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    RunCreated,
    RunStarted,
    StepDecl,
    decode_commit,
)
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra, ensure_infra
from reel.shared.runtime.config import Config

REF = BlobRef(sha256="f" * 64, size_bytes=1)


def created(run_id: str) -> RunCreated:
    return RunCreated(run_id=run_id, branch_id="main", workflow_name="w", workflow_ref=REF,
                      steps=(StepDecl(step_id="s", kind="tool", max_attempts=1000),), created_ms=1)


def started(executor: str = "x-1") -> RunStarted:
    return RunStarted(executor_id=executor, at_ms=2)


def dispatched(attempt: int) -> AttemptDispatched:
    return AttemptDispatched(branch_id="main", step_id="s", attempt=attempt, executor_id="x-1", at_ms=3)


async def stream_messages(infra: Infra, cfg: Config) -> int:
    return (await infra.js.stream_info(cfg.names.events_stream)).state.messages


async def test_a_commit_is_one_message_on_the_runs_subject(event_log: JetStreamEventLog, infra: Infra,
                                                            cfg: Config) -> None:
    """The JetStream layout under the port (the port-level behaviour is in test_eventlog_contract.py)."""
    base = await event_log.commit("r-m", [created("r-m")], expected_lsn=0)
    events: list[AnyEvent] = [started()]
    for n in range(1, 40):
        events += [dispatched(n), AttemptSucceeded(branch_id="main", step_id="s", attempt=n, output_ref=REF,
                                                   at_ms=4)]
    before = await stream_messages(infra, cfg)
    lsn = await event_log.commit("r-m", events, expected_lsn=base)
    assert await stream_messages(infra, cfg) == before + 1
    raw = await infra.js.get_msg(cfg.names.events_stream, lsn)
    assert raw.subject == cfg.names.events("r-m")
    assert decode_commit(raw.data).events == tuple(events)


# ---- infrastructure ------------------------------------------------------------------------------


async def test_ensure_infra_is_idempotent_and_keeps_data(cfg: Config, infra: Infra, event_log: JetStreamEventLog
                                                       ) -> None:
    lsn = await event_log.commit("r-i", [created("r-i")], expected_lsn=0)
    ref = await infra.blobs.put("k", b"blob")
    before = await infra.js.stream_info(cfg.names.events_stream)
    again = await ensure_infra(infra.nc, cfg)
    after = await infra.js.stream_info(cfg.names.events_stream)
    assert after.config == before.config
    assert after.state.messages == before.state.messages
    assert [n for n, _ in await event_log.read("r-i")] == [lsn]
    assert (await again.blobs.get("k")).data == b"blob" and ref.size == 4
    await again.leases.put("k", b"v")
    assert (await infra.leases.get("k")).value == b"v"


async def test_ensure_infra_repairs_a_drifted_stream_config(cfg: Config, infra: Infra) -> None:
    name = cfg.names.events_stream
    drifted = (await infra.js.stream_info(name)).config
    drifted.description = "someone edited this"
    drifted.duplicate_window = 5.0
    drifted.max_msgs_per_subject = 1000
    await infra.js.update_stream(drifted)
    assert (await infra.js.stream_info(name)).config.description == "someone edited this"
    await ensure_infra(infra.nc, cfg)
    fixed = (await infra.js.stream_info(name)).config
    assert fixed.description and fixed.description.startswith("Reel run events")
    assert fixed.duplicate_window == 120.0
    assert fixed.max_msgs_per_subject in (None, -1)
    assert fixed.allow_direct is True


async def test_ensure_infra_concurrently_on_a_fresh_namespace(cfg: Config, infra: Infra) -> None:
    fresh = Config(nats_url=cfg.nats_url, names=Names(cfg.names.namespace + "f"), storage="memory")
    results = await asyncio.gather(*(ensure_infra(infra.nc, fresh) for _ in range(4)))
    assert len(results) == 4
    info = await infra.js.stream_info(fresh.names.events_stream)
    assert info.config.storage == jsapi.StorageType.MEMORY
    log = JetStreamEventLog(infra.nc, fresh.names)
    assert await log.commit("r-1", [created("r-1")], expected_lsn=0) == 1
    await results[3].blobs.put("x", b"y")
    assert (await results[0].blobs.get("x")).data == b"y"
    for stream in (fresh.names.events_stream, fresh.names.commands_stream, fresh.names.verdicts_stream,
                   f"OBJ_{fresh.names.blob_bucket}", f"KV_{fresh.names.lease_bucket}",
                   f"KV_{fresh.names.outcome_bucket}"):
        await infra.js.delete_stream(stream)
