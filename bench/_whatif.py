"""What-if variants used by the benchmarks' ``--experiments`` (NOT what Reel does today).

Each is a local, measured proposal for a change to ``shared/`` or ``services/``;
the benchmarks check that it gives identical results before timing it.

* :func:`read_ordered_consumer` — an ordered push consumer on the run's subject.
* :class:`AckBatch` — the messages of one round trip published together, all acks
  awaited through one future (today: one Task + request future + timer per message).

Landed in ``shared/`` since these benchmarks were written (and so removed here):
one-pass step statuses (fold, planner, views), O(1) step lookup, memoized token
counts, Direct Get replies collected by a callback, the lean guarded commit. ``fold_hot`` (the
mutable fold with its hot events inline) went when the fold became immutable:
its per-commit cost is now ``bench/fold_step.py``'s.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as jsapi

from reel.shared.core.errors import ReelError
from reel.shared.core.run.events import BlobRef
from reel.shared.core.wire.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER
from reel.shared.nats.blobstore import CHUNK_BYTES, ref_for

Outgoing = tuple[str, bytes, dict[str, str] | None]  # subject, body, headers

# ---- reading one subject ----------------------------------------------------------------------------------

async def read_ordered_consumer(js: JetStreamContext, subject: str, *, from_seq: int = 1,
                                timeout_s: float = 60.0) -> list[tuple[int, bytes]]:
    """The subject's messages from ``from_seq`` through an ordered push consumer (callback)."""
    out: list[tuple[int, bytes]] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def collect(msg: Msg) -> None:
        md = msg.metadata
        out.append((md.sequence.stream, msg.data))
        if md.num_pending == 0 and not done.done():
            done.set_result(None)

    config = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq)
    sub = await js.subscribe(subject, cb=collect, ordered_consumer=True, config=config)
    try:
        await asyncio.wait_for(done, timeout_s)
    finally:
        await sub.unsubscribe()
    return out


# ---- publishing: one ack future per round trip ------------------------------------------------------------

class AckBatch:
    """Publish several messages and await all their JetStream acks with one future.

    Today every pipelined publish is an ``nc.request`` wrapped in a Task, each
    with its own future and ``wait_for`` timer; here one wildcard inbox
    subscription resolves one future per batch.
    """

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._prefix = nc.new_inbox()
        self._n = 0
        self._pending: dict[str, tuple[asyncio.Future[list[bytes]], list[bytes], list[int], int]] = {}

    async def start(self) -> AckBatch:
        await self._nc.subscribe(self._prefix + ".*", cb=self._on_ack)
        return self

    async def _on_ack(self, msg: Msg) -> None:
        entry = self._pending.pop(msg.subject, None)
        if entry is None:
            return
        fut, results, left, i = entry
        results[i] = msg.data
        left[0] -= 1
        if left[0] == 0 and not fut.done():
            fut.set_result(results)

    async def publish(self, items: list[Outgoing], timeout_s: float = 10.0) -> list[dict[str, object]]:
        """Send all ``(subject, body, headers)`` now; the parsed acks in order.

        Raises:
            ReelError: a message was refused (the first error).
        """
        fut: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()
        results: list[bytes] = [b""] * len(items)
        left = [len(items)]
        for i, (subject, body, headers) in enumerate(items):
            self._n += 1
            inbox = f"{self._prefix}.{self._n}"
            self._pending[inbox] = (fut, results, left, i)
            await self._nc.publish(subject, body, reply=inbox, headers=headers)
        acks = [json.loads(r) for r in await asyncio.wait_for(fut, timeout_s)]
        for a in acks:
            if "error" in a:
                raise ReelError(f"publish refused: {a['error']}")
        return acks


def small_blob_messages(nc: Client, bucket: str, data: bytes,
                        media_type: str = "text/plain") -> tuple[BlobRef, list[Outgoing]]:
    """The chunk + meta messages ``JetStreamBlobStore._put_small`` sends (NATS ADR-20), and the ref."""
    ref = ref_for(data, media_type)
    nuid = nc._nuid.next().decode()
    meta = {
        "name": ref.sha256, "bucket": bucket, "nuid": nuid, "size": len(data), "chunks": 1,
        "mtime": datetime.now(UTC).isoformat(),
        "digest": "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode(),
        "headers": {"Content-Type": [media_type]}, "options": {"max_chunk_size": CHUNK_BYTES},
    }
    meta_subject = f"$O.{bucket}.M.{base64.urlsafe_b64encode(ref.sha256.encode()).decode()}"
    return ref, [
        (f"$O.{bucket}.C.{nuid}", data, None),
        (meta_subject, json.dumps(meta).encode(), {jsapi.Header.ROLLUP: "sub", EXPECTED_LAST_SUBJECT_SEQ_HEADER: "0"}),
    ]
