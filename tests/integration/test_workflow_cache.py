"""The one workflow cache (shared/application/workflows.py) over the real blob store: parsed once, bounded LRU by
sha256."""

from __future__ import annotations

import json

import pytest

from reel.shared.application.workflows import WorkflowCache
from reel.shared.core.errors import BlobMissing, WorkflowInvalid
from reel.shared.core.run.events import BlobRef
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore


def body(name: str, python: str = "json:loads") -> bytes:
    return encode_workflow(parse_workflow({"name": name, "steps": [
        {"kind": "agent", "id": "solve", "instructions": "Fix it.",
         "context": [{"id": "task", "kind": "task", "text": "x"}],
         "model": {"adapter": "scripted", "turns": [{"text": "done"}]},
         "tools": [{"name": "read_file", "parameters": {"type": "object"}, "python": python}]}]}))


async def test_a_workflow_is_parsed_once_and_the_least_recently_used_is_evicted(blobs: JetStreamBlobStore) -> None:
    a, b, c = [await blobs.put(body(n), "application/json") for n in ("a", "b", "c")]
    cache = WorkflowCache(blobs, max_entries=2)
    first = await cache.load(a)
    assert await cache.load(a) is first and first.name == "a"  # kept: not read or parsed again
    await cache.load(b)
    await cache.load(a)  # a is now the most recently used
    await cache.load(c)  # evicts b, not a
    assert len(cache) == 2
    assert await cache.load(a) is first
    b_again = await cache.load(b)  # read again: a new object, and c is evicted
    assert b_again.name == "b" and len(cache) == 2
    assert await cache.load(c) is not await cache.load(b) and len(cache) == 2


async def test_python_tools_are_resolved_once_and_kept_with_the_spec(blobs: JetStreamBlobStore) -> None:
    ref = await blobs.put(body("t"), "application/json")
    cache = WorkflowCache(blobs)
    tools = await cache.python_tools(ref)
    assert tools[("solve", "read_file")] is json.loads
    assert await cache.python_tools(ref) is tools
    bad = await blobs.put(body("u", python="json:no_such_function"), "application/json")
    assert (await cache.load(bad)).name == "u"  # a spec whose tool does not resolve still reads
    with pytest.raises(WorkflowInvalid):
        await cache.python_tools(bad)


async def test_a_bad_or_missing_blob_is_a_clear_error_and_is_not_cached(blobs: JetStreamBlobStore) -> None:
    cache = WorkflowCache(blobs)
    junk = await blobs.put(b'{"name": "x"}', "application/json")
    with pytest.raises(WorkflowInvalid, match=f"workflow blob {junk.sha256[:12]}"):
        await cache.load(junk)
    with pytest.raises(BlobMissing):
        await cache.load(BlobRef(sha256="0" * 64, size_bytes=3))
    assert len(cache) == 0
    with pytest.raises(ValueError, match="at least 1"):
        WorkflowCache(blobs, max_entries=0)
