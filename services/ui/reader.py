"""The UI's read side: runs, their states, blob pages and live commits — reads only, never a command.

A :class:`RunReader` wraps the pieces of :class:`~reel.shared.nats.client.ReelClient` the UI
needs (its event log, its blob store, the events stream)
and exposes nothing that publishes: no ``command``, ``start``, ``cancel``, ``rewind`` or
``respond``. With credentials it runs as the ``client`` role (docs/security.md), whose
reads are Direct Gets on the events, snapshots and blobs streams and its own ordered
consumers.

Streamed tokens (:meth:`RunReader.tokens`) are read from their core-NATS subjects, which the ``viewer``
role may subscribe to; nothing is published.
The runs page reads an in-process :class:`~reel.services.ui.runindex.RunIndex` that each reader keeps
from the events stream (:meth:`RunReader.indexing`): it notes the stream's last sequence ``S``, follows
the stream from ``S + 1`` with one ordered, headers-only consumer, and loads every run listed at that point
once (snapshot-aware) into a row; a run that gets a commit is re-read into its row. A page asks the stream's
last sequence first and waits (up to :data:`CATCH_UP_S`) until the index has applied it, so it shows every
commit that landed before the request; when the stream's holes changed (its first sequence or deleted count: a
run archived or dropped by retention, whose purge sends nothing to follow) it forgets the runs with no commit left.
Every UI process keeps its own index and rebuilds it when it
starts: the stream is the only truth, nothing is written, and the ``viewer`` role suffices.

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
import structlog
from nats.js import api as jsapi

from reel.services.ui.pages import BlobPage, RunRow, blob_page, blob_refs, page_span, run_row
from reel.services.ui.runindex import RunFilter, RunIndex, RunsPage
from reel.shared.core.errors import BlobMissing, RunNotFound
from reel.shared.core.run.events import BlobRef, Commit
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.livemessages import StreamChunk, decode_chunk
from reel.shared.core.wire.subjects import is_token
from reel.shared.nats.blobread import ChunkIndex
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient

log = structlog.get_logger(__name__)

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
CATCH_UP_S = 2.0
"""How long a runs page waits for the index to apply the commits that landed before the request (s); after
that it shows the index as it stands, saying so."""
BUILD_WAIT_S = 20.0
"""The same wait while the index is still being built (s): a page right after a start waits for the whole index
(10,000 runs take some 7 s: docs/benchmarks.md) rather than show part of it."""
INDEX_LOADS = 16
"""Runs loaded at once while the index is built."""


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
        self.index = RunIndex()
        self._listed = 0  # runs listed when the index was built (0 until then)
        self._applied = -1  # every commit up to this stream sequence is in the index (-1: not built yet)
        self._seen = 0  # the last stream sequence the index's consumer delivered
        self._dirty: dict[str, None] = {}
        self._progress = asyncio.Condition()
        self._wake = asyncio.Event()
        self._index_task: asyncio.Task[None] | None = None
        self._holes: tuple[int, int] = (0, 0)  # the events stream's (first_seq, num_deleted) at the last forget

    @property
    def namespace(self) -> str:
        """The subject/stream namespace read (``reel``)."""
        return self._names.namespace

    @property
    def blobs(self) -> JetStreamBlobStore | None:
        """The object store the runs' bodies are read from (``None``: a client without one)."""
        return self._client.blobs

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

    @contextlib.asynccontextmanager
    async def indexing(self) -> AsyncIterator[RunIndex]:
        """Build :attr:`index` and keep it current for the block (see the module doc); yields it at once, while it
        is still being built."""
        self._ensure_index()
        try:
            yield self.index
        finally:
            task, self._index_task = self._index_task, None
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _ensure_index(self) -> None:
        if self._index_task is None or self._index_task.done():
            self._index_task = asyncio.create_task(self._keep_index(), name="ui-run-index")

    @property
    def index_ready(self) -> bool:
        """True once the index holds every run listed when it was built."""
        return self._applied >= 0

    @property
    def applied(self) -> int:
        """The stream sequence up to which every commit is in :attr:`index` (-1 until it is built)."""
        return self._applied

    @property
    def index_progress(self) -> tuple[int, int]:
        """(runs indexed, runs listed when the build began; 0 until listed)."""
        return len(self.index), self._listed

    async def _keep_index(self) -> None:
        """Build the index and follow the stream; on a failure (the connection lost, a JetStream error) log it,
        wait (1 s, doubling up to 30 s) and build afresh — the old index serves meanwhile."""
        delay = 1.0
        while True:
            try:
                await self._build_and_follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: rebuild, never a dead index
                log.warning("ui.index_failed", error=f"{type(exc).__name__}: {exc}", retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(30.0, delay * 2)

    async def _build_and_follow(self) -> None:
        info = await self._client.js.stream_info(self._names.events_stream)
        start = info.state.last_seq
        self._seen = start
        prefix = self._names.events("")
        self._dirty.clear()

        async def on_msg(msg: Any) -> None:
            self._dirty[msg.subject.removeprefix(prefix)] = None
            self._seen = max(self._seen, msg.metadata.sequence.stream)
            self._wake.set()

        config = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start + 1,
                                      headers_only=True)
        sub = await self._client.js.subscribe(self._names.events("*"), stream=self._names.events_stream, cb=on_msg,
                                              ordered_consumer=True, config=config)
        try:
            index = self.index if not self.index_ready else RunIndex()  # a rebuild: the old one serves meanwhile
            ids = await self._client.log.list_runs()
            self._listed = len(ids)
            gate = asyncio.Semaphore(INDEX_LOADS)

            async def build(rid: str) -> None:
                async with gate:
                    row = await self._load_row(rid)
                if row is not None:
                    index.put(row)

            await asyncio.gather(*(build(rid) for rid in ids))
            self.index = index
            await self._applied_up_to(start)
            while True:
                await self._wake.wait()
                self._wake.clear()
                upto, moved = self._seen, list(self._dirty)
                self._dirty.clear()

                async def reread(rid: str) -> None:
                    async with gate:
                        row = await self.row(rid)
                    if row is None:
                        self.index.drop(rid)
                    else:
                        self.index.put(row)

                await asyncio.gather(*(reread(rid) for rid in moved))
                await self._applied_up_to(upto)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _applied_up_to(self, seq: int) -> None:
        async with self._progress:
            self._applied = max(self._applied, seq)
            self._progress.notify_all()

    async def _load_row(self, run_id: str) -> RunRow | None:
        """The run's row from a load of its own (the state cache is left to the pages people open)."""
        try:
            return run_row(await self._client.log.load(check_run_id(run_id)))
        except RunCorrupt as exc:
            return run_row(exc.state, run_id=run_id, corrupt=exc.corruption)
        except (RunNotFound, NotARunId):
            return None

    async def caught_up(self, timeout_s: float | None = None) -> bool:
        """Wait until the index holds every commit in the events stream now (at most ``timeout_s``; default
        :data:`CATCH_UP_S`, :data:`BUILD_WAIT_S` while it is being built); True if it does (False: it is still
        being built or behind, and shows what it has)."""
        self._ensure_index()
        if timeout_s is None:
            timeout_s = CATCH_UP_S if self.index_ready else BUILD_WAIT_S
        state = (await self._client.js.stream_info(self._names.events_stream)).state
        last = state.last_seq
        async with self._progress:
            try:
                await asyncio.wait_for(self._progress.wait_for(lambda: self._applied >= last), timeout_s)
            except TimeoutError:
                return False
        holes = (state.first_seq, state.num_deleted or 0)
        if holes != self._holes:  # commits were purged (a run archived or dropped by retention): forget those runs
            await self._forget_purged(last)
            self._holes = holes
        return True

    async def _forget_purged(self, upto: int) -> None:
        """Drop from :attr:`index` and the state cache every run with no commit left in the events stream (purged
        by ``reel archive`` or the retention service: a purge sends no message to follow); a run whose head is above
        ``upto`` (created after the stream was listed) is left alone."""
        alive = set(await self._client.log.list_runs())
        for run_id, head in self.index.heads().items():
            if run_id not in alive and head <= upto:
                self.index.drop(run_id)
                self._states.pop(run_id, None)

    async def runs_page(self, f: RunFilter, *, before: int | None = None, after: int | None = None) -> RunsPage:
        """A page of the runs page (:meth:`RunIndex.query`), once the index has caught up (:meth:`caught_up`)."""
        await self.caught_up()
        return self.index.query(f, before=before, after=after)

    async def rows(self) -> list[RunRow]:
        """One :class:`RunRow` per run with a commit, newest first (corrupt runs too: status ``corrupt``), each
        loaded now: a scan of every run (the runs page reads :attr:`index` instead)."""
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
