"""Bounded reads of large bodies on a real JetStream object store (shared/nats/blobread.py).

A body read chunk by chunk is fetched as the reader asks (checked on the connection's received
bytes, not trusted), checked against its sha256 at the end; head and tail come from one streamed
pass; a ``stdin_from`` step gets an earlier output streamed, byte for byte, and a corrupt one
fails the attempt before the command could see the end of its input.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path

import pytest
from nats.js.object_store import ObjectStore

from reel.services.ui.pages import MAX_PAGE_BYTES, blob_page
from reel.services.ui.reader import WHOLE_MAX_BYTES, RunReader
from reel.shared.core.errors import BlobCorrupt, BlobMissing, BlobTimeout, ToolError
from reel.shared.core.pack.packer import PackPolicy
from reel.shared.core.run.events import AttemptDispatched, AttemptSucceeded, RunCreated, StepDecl
from reel.shared.core.run.planning import read_bound
from reel.shared.core.workflow.spec import ToolSpec, parse_workflow
from reel.shared.nats.blobstore import CHUNK_BYTES, JetStreamBlobStore, ref_for
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.proc.tools import CallId, run_tool
from reel.shared.runtime.config import Config
from tests.integration.test_cli import reel
from tests.refold import assert_refold_identical
from tests.support import print_bytes

CALL = CallId("r-1", "main", "s", 1)

PRINTER = str(Path(__file__).parents[1] / "support" / "print_bytes.py")
DIGEST = ("import hashlib, sys\nh, n = hashlib.sha256(), 0\nwhile b := sys.stdin.buffer.read1(1 << 20):\n"
          "    h.update(b); n += len(b)\nprint(n, h.hexdigest())\n")


def fresh(infra: Infra, cfg: Config) -> JetStreamBlobStore:
    return JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)


async def test_chunks_come_in_order_one_request_at_a_time(infra: Infra, cfg: Config) -> None:
    a, b = os.urandom(10 * CHUNK_BYTES + 5), os.urandom(3 * CHUNK_BYTES)
    ra, rb = await asyncio.gather(fresh(infra, cfg).put(a), fresh(infra, cfg).put(b))  # chunks interleaved
    got = [c async for c in fresh(infra, cfg).chunks(ra)]
    assert b"".join(got) == a and [len(c) for c in got] == [CHUNK_BYTES] * 10 + [5]
    assert b"".join([c async for c in fresh(infra, cfg).chunks(rb)]) == b

    before = infra.nc.stats["in_bytes"]
    reader = fresh(infra, cfg).chunks(ra)
    first = await anext(reader)
    received = infra.nc.stats["in_bytes"] - before
    assert first == a[:CHUNK_BYTES] and received < 2 * CHUNK_BYTES, f"{received} bytes came for one chunk"
    await reader.aclose()


async def test_a_corrupt_body_raises_after_its_last_chunk(infra: Infra, cfg: Config) -> None:
    body = os.urandom(2 * CHUNK_BYTES + 9)
    ref = ref_for(body)
    forged = bytearray(body)
    forged[-1] ^= 1
    await infra.blobs.put(ref.sha256, bytes(forged))  # a plain client plants one byte off under the name
    seen = 0
    with pytest.raises(BlobCorrupt, match="sha256 mismatch") as info:
        async for piece in fresh(infra, cfg).chunks(ref):
            seen += len(piece)
    assert seen == len(body), "every chunk was handed on before the mismatch could be known"
    assert f"holds {len(body)} bytes" in info.value.message
    with pytest.raises(BlobCorrupt):
        await fresh(infra, cfg).get_file(ref, None)
    with pytest.raises(BlobMissing, match="not in bucket"):
        await anext(fresh(infra, cfg).chunks(ref_for(b"never stored" * 300)))


@pytest.mark.parametrize(("size", "head", "tail"), [
    (0, 10, 10), (15, 10, 10), (20, 10, 10), (3 * CHUNK_BYTES + 17, 1000, 700_000), (3 * CHUNK_BYTES, 0, 5)])
async def test_head_and_tail_of_a_body(infra: Infra, cfg: Config, size: int, head: int, tail: int) -> None:
    body = os.urandom(size)
    ref = await fresh(infra, cfg).put(body)
    h, t, n = await fresh(infra, cfg).head_tail(ref, head, tail)
    assert n == size and h == body[:head]
    assert t == (body[head:] if size <= head + tail else body[size - tail:])


async def test_a_corrupt_stdin_fails_the_tool_before_it_sees_the_end(infra: Infra, cfg: Config,
                                                                    tmp_path: Path) -> None:
    body = b"line\n" * (CHUNK_BYTES // 2)
    ref = ref_for(body)
    await infra.blobs.put(ref.sha256, body[:-1] + b"!")
    marker = tmp_path / "acted"
    script = f"import sys, pathlib; sys.stdin.buffer.read(); pathlib.Path({str(marker)!r}).write_text('x')"
    with pytest.raises(ToolError) as info:
        await run_tool(ToolSpec(type="command", argv=(sys.executable, "-c", script), timeout_s=60), CALL,
                       stdin=fresh(infra, cfg).chunks(ref))
    assert info.value.kind == "stdin_blob_corrupt" and "sha256 mismatch" in info.value.message
    assert not marker.exists()


async def test_stdin_from_a_large_output_is_streamed_byte_for_byte(
        executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, cfg: Config,
        ) -> None:
    n = 3_000_000 + 17  # over the executor's in-memory spool: stored streamed, never in its body cache
    wf = {"name": "pipe", "steps": [
        {"kind": "tool", "id": "dump", "tool": {"type": "command", "argv": [sys.executable, PRINTER, str(n)]}},
        {"kind": "tool", "id": "digest", "tool": {"type": "command", "argv": [sys.executable, "-c", DIGEST],
                                                  "stdin_from": "dump"}}]}
    started = await client.start(parse_workflow(wf), timeout_s=30)
    assert started.ok and started.run_id, started
    state = await client.wait_for(started.run_id, ("verifying",), timeout_s=90)
    (d,) = state.branches["main"].attempts["dump"]
    (g,) = state.branches["main"].attempts["digest"]
    assert d.output_ref is not None and d.output_ref.sha256 == print_bytes.sha256_of(n)
    assert g.status == "succeeded" and g.output_ref is not None, g
    assert (await blobs.get(g.output_ref)).decode() == f"{n} {hashlib.sha256(print_bytes.expected(n)).hexdigest()}\n"
    await assert_refold_identical(event_log, state)
    code, out, err = await reel(cfg, "show", started.run_id, "--attempt", "dump", "--output")  # streamed to stdout
    assert code == 0 and hashlib.sha256(out.encode()).hexdigest() == print_bytes.sha256_of(n), err[-300:]


async def test_a_model_step_reads_only_what_its_budget_can_use_and_records_the_trim(
        executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore) -> None:
    budget = 3000  # tokens: read_bound = 48,000 bytes, half head, half tail (~2,300 tokens here)
    bound = read_bound(PackPolicy(budget_tokens=budget))
    spaced = "import sys\nfor i in range(20000): sys.stdout.write(f'w{i:05d}' + ' ' * 58)\nprint('END')"
    wf = {"name": "trim", "budget_tokens": budget, "steps": [
        {"kind": "tool", "id": "wide", "tool": {"type": "command", "argv": [sys.executable, "-c", spaced]}},
        {"kind": "tool", "id": "small", "tool": {"type": "recorded", "output": "a small note " * 200}},
        {"kind": "model", "id": "ask", "include_previous_outputs": True,
         "model": {"adapter": "scripted", "outputs": ["fine"]}}]}
    started = await client.start(parse_workflow(wf), timeout_s=30)
    assert started.ok and started.run_id, started
    state = await client.wait_for(started.run_id, ("verifying",), timeout_s=90)
    (wide,) = state.branches["main"].attempts["wide"]
    assert wide.output_ref is not None and wide.output_ref.size_bytes == 20000 * 64 + 4
    (ask,) = state.branches["main"].attempts["ask"]
    p = ask.context
    assert p is not None and p.trimmed == ("out-wide",), p
    assert "out-wide" in p.packed and "out-small" in p.packed  # 64 bytes a token: the trimmed head and tail fit
    assert ask.prompt_ref is not None
    prompt = (await blobs.get(ask.prompt_ref)).decode()
    size = wide.output_ref.size_bytes
    assert f"[reel: output trimmed — {size - bound} of its {size} bytes left out here" in prompt
    assert "w00000" in prompt and "END" in prompt and "w10000" not in prompt  # head, tail, not the middle
    assert ("a small note " * 200) in prompt
    await assert_refold_identical(event_log, state)


async def test_the_ui_pages_a_large_body_by_range_after_checking_it_once(infra: Infra, cfg: Config,
                                                                        client: ReelClient) -> None:
    body = ("aé€😀\n" * 500_000).encode()  # 5.5 MB of 1- to 4-byte characters: chunks and pages cut inside them
    assert len(body) > WHOLE_MAX_BYTES
    data = await fresh(infra, cfg).put(body)
    log = JetStreamEventLog(infra.nc, cfg.names)
    wf = await fresh(infra, cfg).put(b'{"name": "w"}' * 400, "application/json")
    lsn = await log.commit("r-pages", [RunCreated(run_id="r-pages", branch_id="main", workflow_name="w",
                                                  workflow_ref=wf, steps=(StepDecl(step_id="s", kind="tool"),),
                                                  created_ms=1)], expected_lsn=0)
    lsn = await log.commit("r-pages", [AttemptDispatched(branch_id="main", step_id="s", attempt=1, executor_id="x",
                                                         at_ms=2)], expected_lsn=lsn)
    await log.commit("r-pages", [AttemptSucceeded(branch_id="main", step_id="s", attempt=1, output_ref=data,
                                                  at_ms=3)], expected_lsn=lsn)
    reader = RunReader(client)
    first = await reader.blob("r-pages", data.sha256, 0, 1000)
    assert first == blob_page(body, data, 0, 1000)
    before = infra.nc.stats["in_bytes"]
    for offset, length in ((CHUNK_BYTES - 2, 7), (3 * CHUNK_BYTES - 1, 70_000), (len(body) - 5, 100), (17, 1),
                           (len(body) + 10, 5), (5 * CHUNK_BYTES, MAX_PAGE_BYTES)):
        assert await reader.blob("r-pages", data.sha256, offset, length) == blob_page(body, data, offset, length)
    received = infra.nc.stats["in_bytes"] - before
    assert received < 10 * CHUNK_BYTES, f"pages read {received} bytes: not only the chunks holding them"


async def test_a_read_no_server_answers_is_a_timeout_not_a_corrupt_body(infra: Infra, cfg: Config) -> None:
    ref = await fresh(infra, cfg).put(os.urandom(2 * CHUNK_BYTES))
    nowhere = infra.nc.jetstream(prefix="$JS.nowhere.API")  # a JetStream API no server serves: no responders
    obs = ObjectStore(name=cfg.names.blob_bucket, stream=f"OBJ_{cfg.names.blob_bucket}", js=nowhere)
    lost = JetStreamBlobStore(infra.nc, obs, cfg.names.blob_bucket)
    with pytest.raises(BlobTimeout, match="the store did not answer") as info:
        await anext(lost.chunks(ref))
    assert info.value.retryable and not isinstance(info.value, BlobMissing)
