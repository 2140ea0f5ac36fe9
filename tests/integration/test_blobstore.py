"""The content-addressed blob store on a real JetStream object store.

"Stored once" and "fetches nothing" are checked on the server (the object store
stream's message count) and on the wire (messages a connection received), never
by trusting the store's own cache.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js import api as jsapi

from reel.shared.core.errors import BlobCorrupt, BlobMissing
from reel.shared.core.run.events import AttemptDispatched, AttemptSucceeded, ContextPartition, RunCreated, StepDecl
from reel.shared.core.run.views import build_episode_view
from reel.shared.nats.blobstore import CHUNK_BYTES, JetStreamBlobStore, ref_for
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra, connect
from reel.shared.runtime.config import Config
from tests.logcapture import info_logs


def fresh_store(infra: Infra, cfg: Config) -> JetStreamBlobStore:
    """A store with an empty "already stored" cache, so every put really asks the server."""
    return JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)


async def obj_messages(infra: Infra, cfg: Config) -> int:
    return (await infra.js.stream_info(f"OBJ_{cfg.names.blob_bucket}")).state.messages


@pytest.fixture
async def other_nc(cfg: Config, infra: Infra) -> AsyncIterator[Client]:
    nc = await connect(cfg, name="reel-tests-other")
    try:
        yield nc
    finally:
        await nc.close()


async def test_same_bytes_same_ref_stored_once(infra: Infra, cfg: Config) -> None:
    data = b"the same prompt, twice"
    ref = await fresh_store(infra, cfg).put(data)
    assert ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size_bytes == len(data)
    assert ref == ref_for(data)
    stored = await obj_messages(infra, cfg)
    assert stored == 2  # one chunk + one meta record
    again = await fresh_store(infra, cfg).put(data)  # a different process, same body
    assert again == ref
    assert await obj_messages(infra, cfg) == stored, "a second put must not store the body again"
    other = await fresh_store(infra, cfg).put(data + b"!")
    assert other.sha256 != ref.sha256
    assert await obj_messages(infra, cfg) == stored + 2


async def test_concurrent_puts_of_the_same_body_store_it_once(infra: Infra, cfg: Config) -> None:
    data = os.urandom(4096)
    refs = await asyncio.gather(*(fresh_store(infra, cfg).put(data) for _ in range(6)))
    assert len(set(refs)) == 1
    assert await obj_messages(infra, cfg) == 2
    assert await fresh_store(infra, cfg).get(refs[0]) == data


async def test_concurrent_puts_of_the_same_large_body_store_it_once(infra: Infra, cfg: Config) -> None:
    data = os.urandom(3 * CHUNK_BYTES + 5)
    refs = await asyncio.gather(*(fresh_store(infra, cfg).put(data) for _ in range(4)))
    assert len(set(refs)) == 1
    assert await fresh_store(infra, cfg).get(refs[0]) == data
    assert await obj_messages(infra, cfg) == 4 + 1, "one body's chunks and one meta record"


async def test_get_by_ref(blobs: JetStreamBlobStore, infra: Infra, cfg: Config) -> None:
    text = "ünïcödé prompt\n" * 50
    ref = await blobs.put(text.encode(), "text/markdown")
    assert ref.media_type == "text/markdown"
    reader = fresh_store(infra, cfg)
    assert await reader.get(ref) == text.encode()
    assert await reader.get_text(ref) == text
    assert await reader.exists(ref)
    info = await infra.blobs.get_info(ref.sha256)
    assert info.headers and info.headers.get("Content-Type") == ["text/markdown"]


@pytest.mark.parametrize("size", [CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES + 17])
async def test_large_multi_chunk_bodies(infra: Infra, cfg: Config, size: int) -> None:
    data = os.urandom(size)
    ref = await fresh_store(infra, cfg).put(data, "application/octet-stream")
    assert ref.size_bytes == size
    info = await infra.blobs.get_info(ref.sha256)
    assert info.size == size
    assert info.chunks == -(-size // CHUNK_BYTES)  # ceil
    stored = await obj_messages(infra, cfg)
    assert stored == info.chunks + 1
    assert await fresh_store(infra, cfg).get(ref) == data
    assert await fresh_store(infra, cfg).put(data, "application/octet-stream") == ref
    assert await obj_messages(infra, cfg) == stored


async def test_empty_body(infra: Infra, cfg: Config) -> None:
    ref = await fresh_store(infra, cfg).put(b"")
    assert ref.size_bytes == 0 and ref.sha256 == hashlib.sha256(b"").hexdigest()
    assert await fresh_store(infra, cfg).get(ref) == b""
    assert await fresh_store(infra, cfg).put(b"") == ref
    assert await obj_messages(infra, cfg) == 1  # the meta record only
    assert (await infra.blobs.get(ref.sha256)).data in (b"", None)


async def test_missing_blob(blobs: JetStreamBlobStore) -> None:
    ghost = ref_for(b"never stored")
    assert not await blobs.exists(ghost)
    with pytest.raises(BlobMissing, match=ghost.sha256[:12]) as info:
        await blobs.get(ghost)
    assert info.value.code == "blob_missing"


async def test_a_body_that_does_not_match_its_name_is_refused(infra: Infra, blobs: JetStreamBlobStore) -> None:
    claimed = ref_for(b"what the ref promises")
    await infra.blobs.put(claimed.sha256, b"something else entirely")
    with pytest.raises(BlobMissing, match="corrupt"):
        await blobs.get(claimed)


async def test_an_overwritten_blob_reads_as_corrupt_with_what_it_holds(infra: Infra,
                                                                     blobs: JetStreamBlobStore) -> None:
    ref = await blobs.put(b"the real output")
    await infra.blobs.put(ref.sha256, b"forged!")  # a plain client overwrites the object
    with pytest.raises(BlobCorrupt) as info:
        await blobs.get(ref)
    forged = hashlib.sha256(b"forged!").hexdigest()
    assert info.value.code == "blob_corrupt" and isinstance(info.value, BlobMissing)
    assert f"{ref.sha256[:12]}… is corrupt: the object holds 7 bytes hashing to {forged[:12]}…" in info.value.message


async def test_a_meta_record_that_is_not_an_object_reads_as_corrupt(infra: Infra, cfg: Config,
                                                                   blobs: JetStreamBlobStore) -> None:
    ref = ref_for(b"never written")
    meta = f"$O.{cfg.names.blob_bucket}.M.{base64.urlsafe_b64encode(ref.sha256.encode()).decode()}"
    await infra.js.publish(meta, b'{"name": "%s", "bucket": "%s", "size": 3, "chunks": 1}' % (
        ref.sha256.encode(), cfg.names.blob_bucket.encode()))  # no nuid, no digest
    with pytest.raises(BlobCorrupt, match="not a readable object"):
        await blobs.get(ref)


async def test_an_object_planted_under_a_bodys_name_is_replaced_by_the_body(infra: Infra, cfg: Config) -> None:
    """Planted before the body is stored: the writer finds it corrupt, replaces it (fenced on it), keeps the body."""
    body = b"what a run will write"
    ref = ref_for(body)
    await infra.blobs.put(ref.sha256, b"planted")
    with info_logs() as logs:
        assert await fresh_store(infra, cfg).put(body) == ref
    assert await fresh_store(infra, cfg).get(ref) == body
    assert (await infra.blobs.get(ref.sha256)).data == body  # nats-py agrees (digest included)
    replaced = [e for e in logs if e["event"] == "blob.replaced_corrupt"]
    assert [e["sha256"] for e in replaced] == [ref.sha256] and "hashing to" in replaced[0]["reason"]


async def test_an_intact_object_is_never_overwritten(infra: Infra, cfg: Config) -> None:
    body = b"stored once, intact"
    ref = await fresh_store(infra, cfg).put(body)
    meta = f"$O.{cfg.names.blob_bucket}.M.{base64.urlsafe_b64encode(ref.sha256.encode()).decode()}"
    before = await infra.js.get_last_msg(f"OBJ_{cfg.names.blob_bucket}", meta)
    with info_logs() as logs:
        await asyncio.gather(*(fresh_store(infra, cfg).put(body) for _ in range(5)))
    after = await infra.js.get_last_msg(f"OBJ_{cfg.names.blob_bucket}", meta)
    # a put of an existing body touches its meta record (a fresh mtime: the blob collector's grace) and nothing else:
    # the same chunks (nuid), size and digest
    was, now = json.loads(before.data or b"{}"), json.loads(after.data or b"{}")
    assert after.seq > before.seq and now.pop("mtime") >= was.pop("mtime")
    assert now == was
    assert not [e for e in logs if e["event"] == "blob.replaced_corrupt"]


async def test_written_by_nats_py_readable_by_reel(infra: Infra, cfg: Config) -> None:
    for data in (b"small one", os.urandom(CHUNK_BYTES * 2 + 5)):
        ref = ref_for(data, "application/octet-stream")
        await infra.blobs.put(ref.sha256, data, meta=jsapi.ObjectMeta(
            name=ref.sha256, options=jsapi.ObjectMetaOptions(max_chunk_size=128 * 1024)))
        store = fresh_store(infra, cfg)
        assert await store.exists(ref)
        assert await store.get(ref) == data
        before = await obj_messages(infra, cfg)
        assert await store.put(data, "application/octet-stream") == ref
        assert await obj_messages(infra, cfg) == before


async def test_written_by_reel_readable_by_nats_py(infra: Infra, cfg: Config, other_nc: Client) -> None:
    """Reel's own small-object writer speaks the object store's wire format (ADR-20)."""
    obs = await other_nc.jetstream().object_store(cfg.names.blob_bucket)
    for data in (b"written by the pipelined small path", os.urandom(CHUNK_BYTES + 1000)):
        ref = await fresh_store(infra, cfg).put(data, "text/x-test")
        result = await obs.get(ref.sha256)  # nats-py checks the SHA-256 digest itself
        assert result.data == data
        info = result.info
        assert (info.name, info.size, bool(info.deleted)) == (ref.sha256, len(data), False)
        assert info.digest == "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
        assert info.headers == {"Content-Type": ["text/x-test"]}
    listed = {o.name for o in await obs.list()}
    assert len(listed) == 2


async def test_refs_and_views_fetch_nothing(infra: Infra, cfg: Config, blobs: JetStreamBlobStore,
                                            other_nc: Client) -> None:
    """Laziness: building refs and a full view of a run reads the run's commits and no body."""
    workflow = await blobs.put(b'{"name": "w"}' * 1000, "application/json")
    prompt = await blobs.put(b"a long prompt " * 5000)
    output = await blobs.put(b"a long output " * 5000)
    log = JetStreamEventLog(infra.nc, cfg.names)
    lsn = await log.commit("r-lazy", [RunCreated(
        run_id="r-lazy", branch_id="main", workflow_name="w", workflow_ref=workflow,
        steps=(StepDecl(step_id="s", kind="model"),), created_ms=1)], expected_lsn=0)
    lsn = await log.commit("r-lazy", [AttemptDispatched(
        branch_id="main", step_id="s", attempt=1, executor_id="x", at_ms=2, prompt_ref=prompt,
        context=ContextPartition(packed=("a",), available=(), dropped=("b",)))], expected_lsn=lsn)
    await log.commit("r-lazy", [AttemptSucceeded(branch_id="main", step_id="s", attempt=1, output_ref=output,
                                                 at_ms=3)], expected_lsn=lsn)

    reader_log = JetStreamEventLog(other_nc, cfg.names)
    reader_blobs = JetStreamBlobStore(other_nc, await other_nc.jetstream().object_store(cfg.names.blob_bucket),
                                      cfg.names.blob_bucket)
    before = other_nc.stats["in_msgs"], other_nc.stats["in_bytes"]
    state = await reader_log.load("r-lazy", cold=True)
    view = build_episode_view(state)
    refs = [ref_for(b"x" * n) for n in range(100)]
    received = other_nc.stats["in_msgs"] - before[0], other_nc.stats["in_bytes"] - before[1]
    assert received[0] == 3 + 1, "three commits and the end-of-batch status, no blob"
    assert received[1] < prompt.size_bytes, "no body came over the wire"
    before = other_nc.stats["in_msgs"], other_nc.stats["in_bytes"]
    assert build_episode_view(await reader_log.load("r-lazy")) == view  # the default path (looks for a snapshot)
    assert other_nc.stats["in_bytes"] - before[1] < prompt.size_bytes, "no body came over the wire"
    attempt = view.step("s").attempts[0]
    assert attempt.prompt_ref == prompt and attempt.output_ref == output and len(refs) == 100

    # the control: asking for a body is visible on the same counter
    assert await reader_blobs.get(attempt.output_ref) == b"a long output " * 5000
    assert other_nc.stats["in_bytes"] - before[1] > output.size_bytes
