"""The UI's read side: runs, their states, blob pages and live commits — reads only, never a command.

A :class:`RunReader` wraps the pieces of :class:`~reel.shared.nats.client.ReelClient` the UI
needs (its event log, its blob store, the events stream)
and exposes nothing that publishes: no ``command``, ``start``, ``cancel``, ``rewind`` or
``respond``. With credentials it runs as the ``client`` role (docs/security.md), whose
reads are Direct Gets on the events, snapshots and blobs streams and its own ordered
consumers.

Streamed tokens (:meth:`RunReader.tokens`) are read from their core-NATS subjects, which the ``viewer``
role may subscribe to; nothing is published.

Caches (all bounded): the folded state of the last :data:`STATE_CACHE` runs viewed,
brought up to date with only the commits above it (:meth:`JetStreamEventLog.refresh`),
and the last blob bodies read, up to :data:`BLOB_CACHE_BYTES` in total. A body larger than
:data:`WHOLE_MAX_BYTES` is never read whole: it is checked once by a streamed pass that indexes its
chunks, then each page reads only the chunks holding its bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.js import api as jsapi

from reel.services.ui.pages import BlobPage, RunRow, blob_page, blob_refs, page_span, run_row
from reel.shared.core.errors import BlobMissing, RunNotFound
from reel.shared.core.run.events import BlobRef, Commit
from reel.shared.core.run.ids import is_token
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.livemessages import StreamChunk, decode_chunk
from reel.shared.nats.blobread import ChunkIndex
from reel.shared.nats.client import ReelClient

STATE_CACHE = 64
"""Runs whose folded state is kept between page loads."""
BLOB_CACHE_BYTES = 64 * 1024 * 1024
"""Blob bodies kept in memory for paging (bytes, in total)."""
WHOLE_MAX_BYTES = 4 * 1024 * 1024
"""A body up to this size is read whole (and cached) to page it; a larger one is paged by byte range (bytes)."""
INDEX_CACHE = 64
"""Chunk indexes of large bodies kept (:meth:`~reel.shared.nats.blobread.BlobReads.index`: a few ints per chunk)."""


TOKEN_QUEUE = 10_000
"""Streamed messages a :meth:`RunReader.tokens` queue holds before it drops new ones."""


@dataclass(frozen=True)
class StreamedChunk:
    """One message of a model attempt's stream and the parts of its subject
    (``<ns>.stream.<run_id>.<branch_id>.<step_id>.<attempt>``)."""

    run_id: str
    branch_id: str
    step_id: str
    attempt: int
    chunk: StreamChunk


class NotARunId(ValueError):
    """A run id that is not one NATS subject token (``r-…``): it could name many subjects (``>``)."""


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is one subject token (``[A-Za-z0-9_-]{1,128}``).

    Raises:
        NotARunId: it is not (``*``, ``>``, a dot, …).
    """
    if not is_token(run_id):
        raise NotARunId(f"not a run id: {run_id[:80]!r}")
    return run_id


class RunReader:
    """Read-only access to a namespace's runs for the UI (see the module doc)."""

    def __init__(self, client: ReelClient) -> None:
        self._client = client
        self._names = client.cfg.names
        self._states: OrderedDict[str, RunState] = OrderedDict()
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._indexes: OrderedDict[str, ChunkIndex] = OrderedDict()
        self._blob_bytes = 0

    @property
    def namespace(self) -> str:
        """The subject/stream namespace read (``reel``)."""
        return self._names.namespace

    async def state(self, run_id: str) -> RunState:
        """The run's folded state now (cached, refreshed with the commits above the cached head).

        Raises:
            NotARunId: ``run_id`` is not one token.
            RunNotFound: no commit for it.
            RunCorrupt: it is corrupt (the exception carries the state as of its last good commit).
        """
        check_run_id(run_id)
        cached = self._states.pop(run_id, None)
        if cached is None:
            state = await self._client.log.load(run_id)
        else:
            state, _ = await self._client.log.refresh(cached)
        self._states[run_id] = state
        while len(self._states) > STATE_CACHE:
            self._states.popitem(last=False)
        return state

    async def rows(self) -> list[RunRow]:
        """One :class:`RunRow` per run with a commit, newest first (corrupt runs too: status ``corrupt``)."""
        ids = await self._client.log.list_runs()
        gate = asyncio.Semaphore(16)

        async def one(rid: str) -> RunRow | None:
            async with gate:
                return await self.row(rid)

        rows = [r for r in await asyncio.gather(*(one(rid) for rid in ids)) if r is not None]
        return sorted(rows, key=lambda r: (-r.created_ms, r.run_id))

    async def row(self, run_id: str) -> RunRow | None:
        """The run's :class:`RunRow`; ``None`` if it has no commit or its id is not a token."""
        try:
            return run_row(await self.state(run_id))
        except RunCorrupt as exc:
            return run_row(exc.state, run_id=run_id, corrupt=exc.corruption)
        except (RunNotFound, NotARunId):
            return None

    async def blob(self, run_id: str, sha256: str, offset: int, length: int) -> BlobPage:
        """A page of ``length`` bytes from ``offset`` of a blob the run's log references.

        Only bodies the run names (prompts, outputs, tool arguments, its workflow) are served,
        so the UI is not a way to read arbitrary objects; inline refs are answered from the log.

        Raises:
            NotARunId, RunNotFound, RunCorrupt: as :meth:`state`.
            BlobMissing: the run references no blob ``sha256``, or the store has no such object.
            BlobCorrupt, BlobTimeout: as :meth:`JetStreamBlobStore.get`.
        """
        ref = await self._ref(run_id, sha256)
        if ref.size_bytes <= WHOLE_MAX_BYTES:
            return blob_page(await self._body(ref), ref, offset, length)
        index = self._indexes.pop(ref.sha256, None)
        if index is None:
            assert self._client.blobs is not None, "the UI's client has a blob store"
            index = await self._client.blobs.index(ref)  # one streamed pass, checked whole
        self._indexes[ref.sha256] = index
        while len(self._indexes) > INDEX_CACHE:
            self._indexes.popitem(last=False)
        start, stop = page_span(offset, length, ref.size_bytes)
        assert self._client.blobs is not None
        window = await self._client.blobs.read_range(index, start, stop - start)  # only the chunks holding it
        return blob_page(window, ref, offset, length, base=start, total=ref.size_bytes)

    async def whole(self, run_id: str, sha256: str) -> tuple[BlobRef, bytes | None]:
        """A body the run's log references, whole — ``None`` for one over :data:`WHOLE_MAX_BYTES`, which is
        only ever paged (what a conversation view reads).

        Raises:
            As :meth:`blob`.
        """
        ref = await self._ref(run_id, sha256)
        return ref, (await self._body(ref) if ref.size_bytes <= WHOLE_MAX_BYTES else None)

    async def _ref(self, run_id: str, sha256: str) -> BlobRef:
        """The ref of blob ``sha256`` if the run's log (as of its last good commit) references it."""
        try:
            state = await self.state(run_id)
        except RunCorrupt as exc:
            if exc.state is None:
                raise
            state = exc.state
        ref = blob_refs(state).get(sha256)
        if ref is None:
            raise BlobMissing(f"run {run_id} references no blob {sha256[:12]}…")
        return ref

    async def _body(self, ref: BlobRef) -> bytes:
        data = self._blobs.pop(ref.sha256, None)
        if data is None:
            assert self._client.blobs is not None, "the UI's client has a blob store"
            data = await self._client.blobs.get(ref)
            self._blob_bytes += len(data)
        self._blobs[ref.sha256] = data
        while self._blob_bytes > BLOB_CACHE_BYTES and len(self._blobs) > 1:
            _, old = self._blobs.popitem(last=False)
            self._blob_bytes -= len(old)
        return data

    async def commits(self, run_id: str, *, after_lsn: int, upto_lsn: int) -> list[tuple[int, Commit]]:
        """The run's commits with ``after_lsn`` < LSN ≤ ``upto_lsn``, in LSN order."""
        if upto_lsn <= after_lsn:
            return []
        return await self._client.log.read(check_run_id(run_id), from_lsn=after_lsn + 1, upto_lsn=upto_lsn)

    @contextlib.asynccontextmanager
    async def tokens(self, run_ids: Sequence[str]) -> AsyncIterator[asyncio.Queue[StreamedChunk]]:
        """A queue of the streamed tokens of the runs' model attempts from now on, for the block.

        One core-NATS subscription per run on ``<ns>.stream.<run_id>.>`` (docs/subjects.md; the ``viewer``
        role's grant), at the server before this yields. Best effort, as the stream itself: a message that
        does not decode, or one that finds the queue full (:data:`TOKEN_QUEUE`), is dropped — the page sees
        the gap in ``seq`` — and the log keeps the whole response either way.

        Raises:
            NotARunId: a run id is not one token.
        """
        runs = [check_run_id(r) for r in run_ids]
        queue: asyncio.Queue[StreamedChunk] = asyncio.Queue(maxsize=TOKEN_QUEUE)
        prefix = self._names.stream_all.removesuffix(">")

        async def on_msg(msg: Any) -> None:
            parts = msg.subject.removeprefix(prefix).split(".")
            if len(parts) != 4 or not parts[3].isdigit():
                return
            try:
                chunk = decode_chunk(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(StreamedChunk(run_id=parts[0], branch_id=parts[1], step_id=parts[2],
                                               attempt=int(parts[3]), chunk=chunk))

        subs = []
        try:
            for rid in runs:
                subs.append(await self._client.nc.subscribe(self._names.stream_run(rid), cb=on_msg))
            if subs:
                await self._client.nc.flush()  # the server has them: what is streamed from here on arrives
            yield queue
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    @contextlib.asynccontextmanager
    async def moved_runs(self) -> AsyncIterator[asyncio.Queue[str]]:
        """A queue of the run ids that get a commit from now on, for the block.

        One ordered consumer (its own, ephemeral; headers only) on ``<ns>.ev.*`` delivering
        new messages only: the run id is the subject's last token.
        """
        moved: asyncio.Queue[str] = asyncio.Queue(maxsize=10_000)
        prefix = self._names.events("")

        async def on_msg(msg: Any) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                moved.put_nowait(msg.subject.removeprefix(prefix))

        sub = await self._client.js.subscribe(self._names.events("*"), stream=self._names.events_stream, cb=on_msg,
                                              ordered_consumer=True, deliver_policy=jsapi.DeliverPolicy.NEW,
                                              headers_only=True)
        try:
            yield moved
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
