"""Content-addressed blob store on the JetStream object store.

Prompts, outputs, workflows and large tool results live here; commits carry only
:class:`~reel.shared.core.run.events.BlobRef` (sha256 + size). Objects are named by their sha256
hex digest and never overwritten (an overwrite during a ``get`` can hang it).

Bodies are written in the object store's own wire format (NATS ADR-20): 512 KiB
chunks, then the meta record fenced with ``Nats-Expected-Last-Subject-Sequence: 0``
on the meta subject, so an existing object is never replaced (racing writers of
one body: one wins, the others purge their chunks). A single-chunk body and its
meta record go out pipelined in one round trip. Reads (whole, chunk by chunk, into a
file, head and tail) are :mod:`reel.shared.nats.blobread`'s, each checked against the ref's
sha256: an object that does not hold the body its name says (written under the wrong
sha256 by another client, or overwritten) is :class:`~reel.shared.core.errors.BlobCorrupt`,
with what it holds instead. A body of at
most the inline threshold may instead ride in its ref (:func:`ref_for` with
``inline_max``): :meth:`JetStreamBlobStore.get` answers it from the ref,
so readers do not care where a body is.

A large body is streamed (:meth:`JetStreamBlobStore.put_file`: a tool's spool): read and
published chunk by chunk with at most :data:`PUT_WINDOW` chunks unacked, its sha256 and
size checked as it goes, so the writer's memory stays O(window) whatever the size.

A writer that finds an object already under its body's name reads it back once:
an intact one is kept (never overwritten); one that is not intact is *not a blob*
— it is replaced by the body, fenced on exactly the meta record found corrupt (so
an intact object another writer put meanwhile is never replaced), and logged
``blob.replaced_corrupt``. So an object planted under sha256(X) before X is
stored never makes a run that writes X lose X.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections import OrderedDict, deque
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

import msgspec
import structlog
from nats.aio.client import Client
from nats.js import api as jsapi
from nats.js.errors import APIError, NotFoundError
from nats.js.object_store import ObjectStore

from reel.shared.core.errors import BlobCorrupt, BlobMissing
from reel.shared.core.ports import BlobStore
from reel.shared.core.run.events import BlobRef
from reel.shared.core.wire.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER
from reel.shared.nats.blobread import GET_TIMEOUT_S, BlobReads
from reel.shared.nats.blobread import is_inline as is_inline  # re-exported: writers and readers import it from here
from reel.shared.nats.publish import publish_pipelined

log = structlog.get_logger(__name__)

CHUNK_BYTES = 512 * 1024
PUT_WINDOW = 8
"""Chunks of a streamed put in flight (unacked) at once: 4 MiB of the writer's memory."""


def ref_for(data: bytes, media_type: str = "text/plain", *, inline_max: int = 0) -> BlobRef:
    """The :class:`BlobRef` ``data`` will have once stored (pure); with ``data`` inline in it when it is
    at most ``inline_max`` bytes of UTF-8 text (such a ref needs no store: see :func:`is_inline`)."""
    ref = BlobRef(sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data), media_type=media_type)
    if len(data) <= inline_max:
        try:
            return msgspec.structs.replace(ref, inline=data.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return ref


class JetStreamBlobStore(BlobReads):
    """The :class:`~reel.shared.core.ports.BlobStore` port on a JetStream object store bucket (the reads:
    :class:`~reel.shared.nats.blobread.BlobReads`)."""

    def __init__(self, nc: Client, obs: ObjectStore, bucket: str, *, timeout_s: float = GET_TIMEOUT_S,
                 purge: bool = True) -> None:
        self._nc = nc
        self._purges = purge
        self._obs = obs
        self._js = obs._js  # the store's own context (a client's carries its account's API prefix)
        self._bucket = bucket
        self._timeout_s = timeout_s
        self._known: OrderedDict[str, float] = OrderedDict()

    async def put(self, data: bytes, media_type: str = "text/plain") -> BlobRef:
        """Store ``data`` (idempotent: an existing body is not written again); returns its ref."""
        return await (await self.put_async(data, media_type))

    async def put_async(self, data: bytes, media_type: str = "text/plain") -> asyncio.Future[BlobRef]:
        """Start storing ``data``; the future resolves to its ref once the server acked it.

        Raises (from the future):
            nats.js.errors.APIError: the object store refused the write.
        """
        ref = ref_for(data, media_type)
        done: asyncio.Future[BlobRef] = asyncio.get_running_loop().create_future()
        if self._is_known(ref.sha256):
            done.set_result(ref)
            return done
        return asyncio.ensure_future(self._put(ref, data))

    async def put_file(self, source: IO[bytes], ref: BlobRef) -> BlobRef:
        """Store the body read from ``source`` (its position to EOF) as ``ref``, whose sha256 and size are
        known beforehand (a tool's spool hashed as it was written): streamed in :data:`CHUNK_BYTES` chunks,
        at most :data:`PUT_WINDOW` unacked, then the meta record as :meth:`put` writes it (ADR-20).
        Idempotent; an inline ``ref`` needs nothing stored.

        Raises:
            BlobCorrupt: what was read does not hash to ``ref.sha256`` or is not ``ref.size_bytes`` long
                (nothing is stored: the chunks are purged).
            nats.js.errors.APIError, nats.errors.TimeoutError: the object store refused or did not ack.
        """
        if is_inline(ref) or self._is_known(ref.sha256):
            return ref
        nuid, chunk_subject, _ = self._subjects(ref)
        digest, size, n = hashlib.sha256(), 0, 0
        window: deque[asyncio.Future[Any]] = deque()
        try:
            while piece := source.read(CHUNK_BYTES):
                digest.update(piece)
                size, n = size + len(piece), n + 1
                window.append(publish_pipelined(self._nc, chunk_subject, piece, None, self._timeout_s))
                if len(window) >= PUT_WINDOW:
                    await window.popleft()
            await asyncio.gather(*window)
        except BaseException:
            await asyncio.gather(*window, return_exceptions=True)
            await self._purge(chunk_subject)
            raise
        if digest.hexdigest() != ref.sha256 or size != ref.size_bytes:
            await self._purge(chunk_subject)
            raise BlobCorrupt(f"blob {ref.sha256[:12]}…: the body read is {size} bytes hashing to "
                              f"{digest.hexdigest()[:12]}…, not the {ref.size_bytes} bytes named (not stored)")
        return await self._seal(ref, nuid, size, n, digest.digest(), [])

    def _subjects(self, ref: BlobRef) -> tuple[str, str, str]:
        """A new object's nuid, its chunk subject and ``ref``'s meta subject (ADR-20)."""
        nuid = self._nc._nuid.next().decode()
        return nuid, f"$O.{self._bucket}.C.{nuid}", self._meta_subject(ref)

    def _meta_subject(self, ref: BlobRef) -> str:
        return f"$O.{self._bucket}.M.{base64.urlsafe_b64encode(ref.sha256.encode()).decode()}"

    async def _put(self, ref: BlobRef, data: bytes) -> BlobRef:
        """Chunks, then the meta record fenced on "no meta yet" (ADR-20 wire format, never an overwrite)."""
        nuid, chunk_subject, _ = self._subjects(ref)
        pieces = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
        chunks = [publish_pipelined(self._nc, chunk_subject, p, None, self._timeout_s) for p in pieces]
        if len(pieces) > 1:  # the meta record must not name chunks that may not exist
            failed = [r for r in await asyncio.gather(*chunks, return_exceptions=True) if isinstance(r, BaseException)]
            if failed:
                await self._purge(chunk_subject)
                raise failed[0]
            chunks = []
        return await self._seal(ref, nuid, len(data), len(pieces), hashlib.sha256(data).digest(), chunks)

    async def _seal(self, ref: BlobRef, nuid: str, size: int, n_chunks: int, digest: bytes,
                    chunks: list[asyncio.Future[Any]]) -> BlobRef:
        """The meta record of an object whose chunks (``nuid``) are stored, or still in flight (``chunks``:
        a single chunk pipelined with it), fenced on "no meta yet"; an existing object is kept if intact."""
        meta_subject, chunk_subject = self._meta_subject(ref), f"$O.{self._bucket}.C.{nuid}"
        info = jsapi.ObjectInfo(
            name=ref.sha256, bucket=self._bucket, nuid=nuid, size=size, chunks=n_chunks,
            mtime=datetime.now(UTC).isoformat(),
            digest="SHA-256=" + base64.urlsafe_b64encode(digest).decode(),
            headers={"Content-Type": [ref.media_type]},
            options=jsapi.ObjectMetaOptions(max_chunk_size=CHUNK_BYTES),
        )
        meta_body = json.dumps(info.as_dict()).encode()
        meta = publish_pipelined(self._nc, meta_subject, meta_body, _meta_headers(0), self._timeout_s)
        results = await asyncio.gather(*chunks, meta, return_exceptions=True)
        meta_result = results[-1]
        if isinstance(meta_result, APIError) and meta_result.err_code == 10071:
            try:
                replaced = await self._over_existing(ref, meta_subject, meta_body)
            except BaseException:
                await self._purge(chunk_subject)
                raise
            if not replaced:
                await self._purge(chunk_subject)  # the object already existed; drop our duplicate chunks
        elif isinstance(meta_result, BaseException):
            await self._purge(chunk_subject)
            raise meta_result
        elif chunks and isinstance(results[0], BaseException):
            await self._purge(meta_subject)
            raise results[0]
        self._remember(ref.sha256)
        return ref

    async def _over_existing(self, ref: BlobRef, meta_subject: str, meta_body: bytes) -> bool:
        """An object exists under ``ref``'s name: keep it if intact (False), else replace its meta record
        by ours, fenced on the one found corrupt (True).

        Raises:
            BlobCorrupt: the name kept changing under us (3 looks).
            BlobTimeout: the existing object could not be read back in time.
        """
        stream = f"OBJ_{self._bucket}"
        looked = False
        for _ in range(3):
            try:
                found = await self._nc.jetstream().get_last_msg(stream, meta_subject)
            except NotFoundError:
                found = None
            why = "the object is gone" if found is None else await self._why_not_intact(ref)
            if why is None and found is not None:
                if looked or await self._touch(meta_subject, found):
                    return False  # touched by us, or written since our first look (so as young as a touch)
                looked = True
                continue  # it changed since we looked (the collector deleted it, or another writer touched it)
            expected = 0 if found is None else found.seq or 0
            try:
                await publish_pipelined(self._nc, meta_subject, meta_body, _meta_headers(expected), self._timeout_s)
            except APIError as exc:
                if exc.err_code == 10071:
                    continue  # it changed since we looked: look again
                raise
            # the chunks the corrupt record named are left alone: they may be another object's
            log.warning("blob.replaced_corrupt", sha256=ref.sha256, reason=why)
            self._remember(ref.sha256)
            return True
        raise BlobCorrupt(f"blob {ref.sha256[:12]}… kept changing while it was written (not stored)")

    async def _touch(self, meta_subject: str, found: Any) -> bool:
        """Write the existing object's meta record again with a fresh mtime, fenced on the record found: a writer
        about to reference an existing body makes it young, so the blob collector (which deletes only objects older
        than its grace, fenced on the record it judged) keeps it. False: the record changed since it was read.

        The collector's side of this guard: :mod:`reel.shared.nats.retention`."""
        info = json.loads(found.data)
        info["mtime"] = datetime.now(UTC).isoformat()
        try:
            await publish_pipelined(self._nc, meta_subject, json.dumps(info).encode(),
                                    _meta_headers(found.seq or 0), self._timeout_s)
        except APIError as exc:
            if exc.err_code == 10071:
                return False
            raise
        return True

    async def _why_not_intact(self, ref: BlobRef) -> str | None:
        """Why the object under ``ref``'s name is not ``ref``'s body, or ``None`` if it is."""
        try:
            await self.get_file(ref, None)  # streamed: an existing large object is never read whole
        except BlobCorrupt as exc:
            return exc.message
        except BlobMissing as exc:
            return exc.message
        return None

    async def _purge(self, subject: str) -> None:
        """Drop this writer's own chunks of an object it did not seal (best effort); with ``purge=False`` (a role
        the server does not let purge: a purge's filter is in its body, which permissions cannot see, so no role
        but the operator may purge at all) they are left, unreferenced, for the operator to collect."""
        if not self._purges:
            log.debug("blob.chunks_left", subject=subject)
            return
        try:
            await self._nc.jetstream().purge_stream(f"OBJ_{self._bucket}", subject=subject)
        except Exception as exc:  # cleanup is best effort; the object itself is consistent
            log.warning("blob.purge_failed", subject=subject, error=str(exc))


def _meta_headers(expected_seq: int) -> dict[str, str]:
    """A meta record replaces the subject's earlier one (rollup), fenced on the sequence it expects there."""
    return {jsapi.Header.ROLLUP: "sub", EXPECTED_LAST_SUBJECT_SEQ_HEADER: str(expected_seq)}


if TYPE_CHECKING:
    _port: type[BlobStore] = JetStreamBlobStore  # the adapter satisfies its port (mypy checks it)
