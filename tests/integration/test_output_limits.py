"""Tool output limits on a real nats-server, through the real executor.

A ``command`` tool printing 10 MB: past its cap it fails ``output_too_large`` (a failed attempt,
retried per ``max_attempts``) or, with ``on_overflow: truncate``, succeeds with its head kept
and the attempt marked ``truncated`` — in the log, the fold, the AttemptView, ``reel show`` and
what a model is later shown. Under the cap the whole output is stored, streamed; every blob's
sha256 is checked against the bytes the process really printed.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.console import Console

from reel.services.timeline.render import print_timeline
from reel.shared.core.errors import BlobCorrupt
from reel.shared.core.run.events import AttemptSucceeded, BlobRef
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.core.workflow.toolspec import OUTPUT_TOO_LARGE, truncation_note
from reel.shared.nats.blobstore import CHUNK_BYTES, JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.refold import assert_refold_identical
from tests.support import print_bytes
from tests.support.chat_server import ChatServer, call, reply

PRINTER = str(Path(__file__).parents[1] / "support" / "print_bytes.py")
TEN_MB = 10_000_000


def printing(n_bytes: int, **tool: Any) -> dict[str, Any]:
    return {"type": "command", "name": "dump", "argv": [sys.executable, PRINTER, str(n_bytes)], "timeout_s": 60,
            **tool}


def workflow(tool: dict[str, Any], **step: Any) -> dict[str, Any]:
    return {"name": "big-output", "steps": [{"kind": "tool", "id": "dump", "tool": tool, **step}]}


async def run(client: ReelClient, wf: dict[str, Any]) -> Any:
    started = await client.start(parse_workflow(wf), timeout_s=30)
    assert started.ok and started.run_id, started
    return await client.wait_for(started.run_id, ("verifying",), timeout_s=90)


async def stored_bytes(blobs: JetStreamBlobStore, ref: BlobRef) -> bytes:
    into = io.BytesIO()
    assert await blobs.get_file(ref, into) == ref.size_bytes
    return into.getvalue()


async def test_ten_mb_past_the_default_cap_fails_output_too_large_and_is_retried(
        executor: None, client: ReelClient, event_log: JetStreamEventLog) -> None:
    state = await run(client, workflow(printing(TEN_MB), max_attempts=2))  # default cap: 8 MiB, fail
    atts = state.branches["main"].attempts["dump"]
    assert [(a.status, a.error_kind, a.retryable) for a in atts] == [("failed", OUTPUT_TOO_LARGE, True)] * 2
    assert all(f"printed {TEN_MB} bytes" in (a.error_message or "") and "8388608" in (a.error_message or "")
               for a in atts)
    assert all(a.output_ref is None for a in atts)
    await assert_refold_identical(event_log, state)


async def test_ten_mb_with_truncate_keeps_the_head_marked_truncated(
        executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore) -> None:
    cap = 3 * CHUNK_BYTES + 17  # several chunks and a partial one, cut mid-line
    state = await run(client, workflow(printing(TEN_MB, max_output_bytes=cap, on_overflow="truncate")))
    (a,) = state.branches["main"].attempts["dump"]
    assert a.status == "succeeded" and a.truncated is True and a.output_ref is not None
    head = print_bytes.expected(cap)
    assert (a.output_ref.size_bytes, a.output_ref.sha256) == (cap, hashlib.sha256(head).hexdigest())
    assert await stored_bytes(blobs, a.output_ref) == head
    assert await blobs.get(a.output_ref) == head
    commits = await event_log.read(state.run_id)
    (ok,) = [e for _, c in commits for e in c.events if isinstance(e, AttemptSucceeded)]
    assert ok.truncated is True
    (view,) = build_episode_view(state).steps[0].attempts
    assert view.truncated is True
    console = Console(file=io.StringIO(), width=200)
    print_timeline(console, state)
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert "(truncated)" in shown and f"dump#1: output truncated to its first {cap} B" in shown
    await assert_refold_identical(event_log, state)


async def test_ten_mb_under_its_cap_is_stored_whole_and_not_marked(
        executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore) -> None:
    state = await run(client, workflow(printing(TEN_MB, max_output_bytes=TEN_MB)))
    (a,) = state.branches["main"].attempts["dump"]
    assert a.status == "succeeded" and a.truncated is not True and a.output_ref is not None
    whole = print_bytes.expected(TEN_MB)
    assert (a.output_ref.size_bytes, a.output_ref.sha256) == (TEN_MB, hashlib.sha256(whole).hexdigest())
    assert await stored_bytes(blobs, a.output_ref) == whole
    commits = await event_log.read(state.run_id)
    (ok,) = [e for _, c in commits for e in c.events if isinstance(e, AttemptSucceeded)]
    assert ok.truncated is msgspec.UNSET, "an untruncated success carries no flag on the wire"
    await assert_refold_identical(event_log, state)


async def test_a_streamed_put_is_checked_against_its_name_and_read_back_streamed(
        infra: Infra, cfg: Config, blobs: JetStreamBlobStore) -> None:
    body = print_bytes.expected(5 * CHUNK_BYTES + 3)
    ref = BlobRef(sha256=hashlib.sha256(body).hexdigest(), size_bytes=len(body))
    wrong = BlobRef(sha256=hashlib.sha256(b"something else").hexdigest(), size_bytes=len(body))
    before = (await infra.js.stream_info(f"OBJ_{cfg.names.blob_bucket}")).state.messages
    with pytest.raises(BlobCorrupt, match="not the"):
        await blobs.put_file(io.BytesIO(body), wrong)
    assert (await infra.js.stream_info(f"OBJ_{cfg.names.blob_bucket}")).state.messages == before, "chunks purged"
    assert await blobs.put_file(io.BytesIO(body), ref) == ref
    assert await stored_bytes(blobs, ref) == body
    fresh = JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)  # no cache: asks the server
    after = (await infra.js.stream_info(f"OBJ_{cfg.names.blob_bucket}")).state.messages
    assert await fresh.put_file(io.BytesIO(body), ref) == ref  # idempotent: the intact object is kept
    assert (await infra.js.stream_info(f"OBJ_{cfg.names.blob_bucket}")).state.messages == after
    await infra.blobs.put(wrong.sha256, body)  # planted by a plain client under another body's name
    with pytest.raises(BlobCorrupt, match="sha256 mismatch"):
        await fresh.get_file(wrong, io.BytesIO())


async def test_an_agent_sees_truncated_tool_output_marked(
        executor: None, client: ReelClient, chat_server: ChatServer, event_log: JetStreamEventLog,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A truncated tool step's output in the agent's context, and a truncated agent tool result, both end
    with the truncation note in what the model is sent."""
    monkeypatch.setenv("REEL_TEST_OUT_KEY", "sk-test")
    cap = 3000
    spec = parse_workflow({"name": "agent-reads-big", "steps": [
        {"kind": "tool", "id": "dump", "tool": printing(TEN_MB, max_output_bytes=cap, on_overflow="truncate")},
        {"kind": "agent", "id": "solve", "max_turns": 3,
         "context": [{"id": "task", "kind": "task", "text": "Summarise the log."},
                     {"id": "log", "kind": "doc", "from_step": "dump"}],
         "model": {"adapter": "openai", "base_url": chat_server.url, "model": "m", "api_key_env": "REEL_TEST_OUT_KEY",
                   "timeout_s": 10},
         "tools": [{"name": "more", "command": [sys.executable, PRINTER, "50000"], "max_output_bytes": 1000}]}]})
    chat_server.script(reply(None, [call("more", {})]), reply("a summary"))
    started = await client.start(spec, timeout_s=30)
    assert started.ok and started.run_id
    state = await client.wait_for(started.run_id, ("verifying",), timeout_s=90)
    atts = state.branches["main"].attempts
    assert atts["dump"][0].truncated is True
    assert [(a.status, a.truncated) for a in atts["solve:t1:c0"]] == [("succeeded", True)]
    assert atts["solve:t2"][0].truncated is msgspec.UNSET
    assert len(chat_server.requests) == 2
    t1, t2 = (json.dumps(r.body["messages"]) for r in chat_server.requests)
    note = json.dumps(truncation_note(cap))[1:-1]
    head = json.dumps(print_bytes.expected(cap).decode())[1:-1]
    assert head + note in t1, "turn 1 shows the tool step's head, then the note"
    tool_msgs = [m for m in chat_server.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == [print_bytes.expected(1000).decode() + truncation_note(1000)]
    assert note in t2
    await assert_refold_identical(event_log, state)
