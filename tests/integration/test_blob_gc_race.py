"""The blob collector against a writer about to reference a blob it judged garbage, on a real nats-server.

A blob X no run references is a candidate; between the collector's mark and its deletes (a rendezvous:
``sweep(after_mark=…)``) a writer references X in a new run:

* **commit in the window** — a writer that stored X a moment ago (its cache of stored names: no put, no touch)
  commits a run naming X. The re-check of the commits appended since the mark keeps X.
* **put in the window, commit after** — a fresh writer puts X (it exists: the put touches its meta record) and
  commits once the sweep is over. The delete, fenced on the meta record judged, fails and keeps X.

With ``guard=False`` (no re-check, an unfenced delete) the same interleavings lose X: the new run's commit names a
blob that is gone — the race the guard closes, shown by the same assertions failing."""

from __future__ import annotations

import os
import time

import pytest

from reel.shared.core.errors import BlobMissing
from reel.shared.core.run.events import BlobRef, RunCreated, StepDecl
from reel.shared.core.run.retention import RetentionPolicy
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.nats.retention import stored_blobs, sweep
from reel.shared.runtime.config import Config


def store(infra: Infra, cfg: Config) -> JetStreamBlobStore:
    return JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)


async def referencing_run(log: JetStreamEventLog, run_id: str, ref: BlobRef) -> None:
    """A new run whose ``run_created`` names ``ref`` (as its workflow)."""
    await log.commit(run_id, [RunCreated(run_id=run_id, branch_id="main", workflow_name="w", created_ms=0,
                                         workflow_ref=ref, steps=(StepDecl(step_id="a", kind="tool"),))],
                     expected_lsn=0, writer="test")


def now() -> int:
    return int(time.time() * 1000) + 1


async def names_in_store(infra: Infra, cfg: Config) -> set[str]:
    return {b.sha256 for b, _ in await stored_blobs(infra, cfg.names)}


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "unguarded"])
async def test_a_commit_between_mark_and_delete_keeps_its_blob(infra: Infra, cfg: Config,
                                                               event_log: JetStreamEventLog, guard: bool) -> None:
    writer = store(infra, cfg)
    x = await writer.put(os.urandom(4096), "application/octet-stream")
    garbage = await store(infra, cfg).put(os.urandom(4096))

    async def in_the_window() -> None:
        assert await writer.put(await writer.get(x), x.media_type) == x  # cached: nothing written, nothing touched
        await referencing_run(event_log, "r-late-commit", x)

    report = await sweep(infra, cfg.names, RetentionPolicy(), now_ms=now(), grace_s=0, after_mark=in_the_window,
                         guard=guard)
    assert garbage.sha256 not in await names_in_store(infra, cfg), "an unreferenced blob is collected"
    if guard:
        assert report.saved_by_guard == 1 and report.deleted == 1, report
        assert await store(infra, cfg).get(x) and x.sha256 in await names_in_store(infra, cfg)
    else:
        assert report.deleted == 2, report
        with pytest.raises(BlobMissing):
            await store(infra, cfg).get(x)  # the run names a blob that is gone


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "unguarded"])
async def test_a_put_between_mark_and_delete_keeps_its_blob_for_the_commit_after(
        infra: Infra, cfg: Config, event_log: JetStreamEventLog, guard: bool) -> None:
    body = os.urandom(4096)
    x = await store(infra, cfg).put(body, "application/octet-stream")

    async def in_the_window() -> None:
        assert await store(infra, cfg).put(body, "application/octet-stream") == x  # exists: touched

    report = await sweep(infra, cfg.names, RetentionPolicy(), now_ms=now(), grace_s=0, after_mark=in_the_window,
                         guard=guard)
    await referencing_run(event_log, "r-commit-after", x)  # the writer's commit, after the sweep
    if guard:
        assert report.saved_by_guard == 1 and report.deleted == 0, report
        assert await store(infra, cfg).get(x) == body
    else:
        assert report.deleted == 1, report
        with pytest.raises(BlobMissing):
            await store(infra, cfg).get(x)


async def test_a_referenced_or_young_blob_is_never_collected_and_a_collected_one_can_be_stored_again(
        infra: Infra, cfg: Config, event_log: JetStreamEventLog) -> None:
    kept = await store(infra, cfg).put(os.urandom(3000))
    body = os.urandom(3000)
    young = await store(infra, cfg).put(body)
    await referencing_run(event_log, "r-keeps", kept)
    report = await sweep(infra, cfg.names, RetentionPolicy(), now_ms=now(), grace_s=3600)
    assert report.deleted == 0 and {kept.sha256, young.sha256} <= await names_in_store(infra, cfg)
    report = await sweep(infra, cfg.names, RetentionPolicy(), now_ms=now(), grace_s=0)
    assert report.deleted == 1 and await names_in_store(infra, cfg) == {kept.sha256}
    info = await infra.js.stream_info(f"OBJ_{cfg.names.blob_bucket}")
    assert info.state.messages == 2, "the collected blob's chunks and meta record are gone, no marker left"
    assert await store(infra, cfg).put(body) == young  # stored again: a live object
    assert await store(infra, cfg).get(young) == body


async def test_a_blob_only_an_outcome_marker_names_is_kept(infra: Infra, cfg: Config) -> None:
    """An executor records an output's ref in its outcome marker before the commit; recovery may commit it later."""
    import msgspec

    recorded = await store(infra, cfg).put(os.urandom(3000))
    await infra.outcomes.put("r-x.main.a.1", msgspec.json.encode(recorded))
    report = await sweep(infra, cfg.names, RetentionPolicy(), now_ms=now(), grace_s=0)
    assert report.deleted == 0 and recorded.sha256 in await names_in_store(infra, cfg)


async def test_the_files_a_kept_runs_workspace_manifest_names_are_kept(infra: Infra, cfg: Config, tmp_path: object
                                                                        ) -> None:
    """A workspace's file bodies are named by its manifest only (docs/workspaces.md), never by an event."""
    from pathlib import Path

    from reel.shared.application import workspace
    from reel.shared.core.workflow.spec import WorkspaceSpec

    folder = Path(str(tmp_path)) / "ws"
    folder.mkdir()
    (folder / "a.bin").write_bytes(os.urandom(3000))
    blobs = store(infra, cfg)
    snap = await workspace.snapshot(folder, WorkspaceSpec(from_="ws"), blobs)
    file_sha = snap.manifest.files["a.bin"].sha256
    log = JetStreamEventLog(infra.nc, cfg.names)
    await log.commit("r-ws", [RunCreated(run_id="r-ws", branch_id="main", workflow_name="w", created_ms=0,
                                         workflow_ref=snap.ref, steps=(StepDecl(step_id="a", kind="tool"),),
                                         workspace=snap.ref)], expected_lsn=0, writer="test")
    orphan = await blobs.put(os.urandom(2000))  # named by nothing: collected, so the sweep does collect
    report = await sweep(infra, cfg.names, RetentionPolicy(), now_ms=now(), grace_s=0)
    kept = await names_in_store(infra, cfg)
    assert report.deleted == 1 and orphan.sha256 not in kept
    assert snap.ref.sha256 in kept and file_sha in kept
