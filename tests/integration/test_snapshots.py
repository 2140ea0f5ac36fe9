"""Run-state snapshots: a shortcut for reads that must always equal a cold re-fold.

The port-level behaviour (a snapshot load equals a cold fold and reads only the commits
above it) is in the contract suite, tests/integration/test_eventlog_contract.py.
"""

from __future__ import annotations

import msgspec
import nats.js.errors
import pytest

from reel.shared.core.run.events import AttemptDispatched, AttemptSucceeded, BlobRef, RunCancelled
from reel.shared.core.run.statecodec import STATE_ENCODER, state_decoder
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats import snapshots
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.nats.snapshots import SnapshotRef
from tests.integration.scenarios import commit_events, create_manual_run, wait_until

_enc = STATE_ENCODER
OUT = BlobRef(sha256="1" * 64, size_bytes=1)


async def _same(log: JetStreamEventLog, run_id: str, upto: int | None = None) -> bytes:
    warm = await log.load(run_id, upto_lsn=upto)
    cold = await log.load(run_id, upto_lsn=upto, cold=True)
    assert _enc.encode(warm) == _enc.encode(cold)
    return _enc.encode(warm)


async def test_the_executor_snapshots_the_verifying_state_and_loads_equal_a_cold_fold(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, infra: Infra
) -> None:
    spec = parse_workflow({"name": "snap", "steps": [
        {"kind": "tool", "id": f"s{i}", "max_attempts": 2,
         "tool": {"type": "scripted", "outputs": [{"error": "flaky"}, f"out {i}"] if i % 3 == 0 else [f"out {i}"]}}
        for i in range(12)]})
    reply = await client.start(spec)
    assert reply.run_id
    state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    # the snapshot is stored beside the trigger, after the Verifying commit (a read shortcut):
    # the client may see verifying first, so wait for the entry (bounded), then check what it holds
    async def stored() -> object:
        try:
            return await infra.snapshots.get(reply.run_id)
        except nats.js.errors.KeyNotFoundError:
            return None

    entry = await wait_until(stored, timeout_s=10, what="the Verifying snapshot in the KV bucket")
    assert entry.value is not None
    ref = state_decoder(SnapshotRef).decode(entry.value)
    verifying = [(lsn, c) for lsn, c in await event_log.read(reply.run_id) if lsn == state.verifying_lsn]
    assert ref.lsn == state.verifying_lsn and ref.commit_id == verifying[0][1].commit_id
    await _same(event_log, reply.run_id, upto=state.verifying_lsn)
    await commit_events(event_log, reply.run_id, RunCancelled(reason="after the snapshot", at_ms=1))
    assert b'"cancelled"' in await _same(event_log, reply.run_id)  # snapshot + the commit above it


async def test_a_snapshot_that_does_not_match_the_log_is_ignored(infra: Infra, event_log: JetStreamEventLog) -> None:
    run = "r-snapshot-mismatch"
    await create_manual_run(event_log, run, [("s", 1)])
    await commit_events(event_log, run, AttemptDispatched(branch_id="main", step_id="s", attempt=1,
                                                          executor_id="x", at_ms=1))
    store = await event_log.snapshots()
    assert store is not None
    state = await event_log.load(run, cold=True)
    forged = msgspec.structs.replace(state, status="completed")  # a state the log does not say
    await store.save(forged, commit_id="not-the-commit-at-that-lsn")
    assert (await event_log.load(run)).status == "running"  # mismatch detected: cold fold
    await store.save(forged, commit_id=(await event_log.read(run))[-1][1].commit_id)
    assert (await event_log.load(run)).status == "completed"  # (a matching snapshot is trusted: writers own it)
    stale = SnapshotRef(run_id=run, lsn=state.head_lsn, commit_id="x", state_ref=OUT, fold_version=0)
    await infra.snapshots.put(run, _enc.encode(stale))  # another fold version: ignored
    assert (await event_log.load(run)).status == "running"


async def test_a_large_snapshot_goes_to_the_blob_store(
    event_log: JetStreamEventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = "r-snapshot-large"
    await create_manual_run(event_log, run, [("s", 1)])
    await commit_events(event_log, run, AttemptDispatched(branch_id="main", step_id="s", attempt=1,
                                                          executor_id="x", at_ms=1))
    monkeypatch.setattr(snapshots, "INLINE_MAX_BYTES", 0)  # every state counts as large
    store = await event_log.snapshots()
    assert store is not None
    ref = await store.save(await event_log.load(run, cold=True), (await event_log.read(run))[-1][1].commit_id)
    assert ref.state is None and ref.state_ref is not None
    await commit_events(event_log, run, AttemptSucceeded(branch_id="main", step_id="s", attempt=1,
                                                         output_ref=OUT, at_ms=2))
    assert b'"succeeded"' in await _same(event_log, run)
