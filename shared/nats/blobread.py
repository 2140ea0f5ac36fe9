"""The reading side of the blob store (NATS ADR-20): bodies checked against their sha256.

:class:`BlobReads` is the half of :class:`~reel.shared.nats.blobstore.JetStreamBlobStore` that reads.
Every read checks what it read against the ref's sha256 (and size): an object that does not hold
the body its name says is :class:`~reel.shared.core.errors.BlobCorrupt`, with what it holds instead.

* :meth:`~BlobReads.get` — a body whole (small bodies: prompts, workflows, the common output). One
  chunk, the common case, costs two requests (the meta record, the chunk), no consumer.
* :meth:`~BlobReads.chunks` — a body chunk by chunk as an async iterator, never held whole: each
  chunk is one message get (``next_by_subj`` from the previous chunk's sequence: a Direct Get, asked
  again of the stream leader if a follower has not applied it yet), fetched only when
  the consumer asks for the next one (backpressure: a command's stdin, a file), each under the
  store's timeout. The sha256 and size are checked as it goes; a mismatch raises
  :class:`BlobCorrupt` *after* the last chunk — a consumer acting as it streams must treat the
  body as unchecked until the iterator ends.
* :meth:`~BlobReads.get_file` — :meth:`chunks` into a file (or only checked).
* :meth:`~BlobReads.head_tail` — the first and last bytes of a body (what a context packer can
  use of a large output), streamed and checked whole, O(head + tail + one chunk) memory.
* :meth:`~BlobReads.index` then :meth:`~BlobReads.read_range` — byte ranges of a body (a viewer's
  pages): one streamed pass checks it whole and notes each chunk's stream sequence; a range then
  reads only the chunks that hold it, by sequence (a message at a sequence never changes).

An inline ref (its body in the ref) is answered from the ref, checked the same way.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import IO, TypeVar

from nats import errors as nats_errors
from nats.js import api as jsapi
from nats.js import client as jsclient
from nats.js.errors import NotFoundError, ServiceUnavailableError
from nats.js.object_store import ObjectStore

from reel.shared.core.errors import BlobCorrupt, BlobMissing, BlobTimeout
from reel.shared.core.run.events import BlobRef

GET_TIMEOUT_S = 30.0
_UNANSWERED = (nats_errors.NoRespondersError, ServiceUnavailableError, nats_errors.ConnectionClosedError,
               nats_errors.ConnectionReconnectingError, nats_errors.StaleConnectionError)
KNOWN_CACHE = 4096
KNOWN_TTL_S = 300.0
"""How long (s) a name stays in a writer's cache of stored bodies (:meth:`BlobReads._remember`): a put of a body
found there writes nothing and touches nothing, so the blob collector's grace (``REEL_BLOB_GRACE_S``, at least
twice this) must outlast it (docs/operations.md, "Blob collection")."""
T = TypeVar("T")


def is_inline(ref: BlobRef) -> bool:
    """True if ``ref`` carries its body (nothing to store or fetch)."""
    return isinstance(ref.inline, str)


@dataclass(frozen=True, slots=True)
class ChunkIndex:
    """Where a checked body's chunks are (:meth:`BlobReads.index`): chunk ``k`` is the message at stream
    sequence ``seqs[k]`` on ``subject`` and holds bytes ``starts[k]`` ≤ b < ``starts[k + 1]``; an inline
    body is ``inline`` itself. ``starts[-1]`` is the body's size (bytes)."""

    ref: BlobRef
    subject: str
    seqs: tuple[int, ...]
    starts: tuple[int, ...]
    inline: bytes = b""


class BlobReads:
    """Reads of a JetStream object store bucket, checked against the refs' sha256 (see module doc)."""

    _obs: ObjectStore
    _js: jsclient.JetStreamContext
    _bucket: str
    _timeout_s: float
    _known: OrderedDict[str, float]

    def _remember(self, sha: str) -> None:
        """Note ``sha`` as stored (an LRU of :data:`KNOWN_CACHE` names, each for :data:`KNOWN_TTL_S` seconds: such a
        body is not written again)."""
        self._known[sha] = time.monotonic()
        self._known.move_to_end(sha)
        if len(self._known) > KNOWN_CACHE:
            self._known.popitem(last=False)

    def _is_known(self, sha: str) -> bool:
        """Whether ``sha`` was stored or touched by this process less than :data:`KNOWN_TTL_S` seconds ago."""
        at = self._known.get(sha)
        if at is None:
            return False
        if time.monotonic() - at < KNOWN_TTL_S:
            return True
        del self._known[sha]
        return False

    async def exists(self, ref: BlobRef) -> bool:
        """True if the store holds the body of ``ref``."""
        if is_inline(ref) or self._is_known(ref.sha256):
            return True
        try:
            await asyncio.wait_for(self._obs.get_info(ref.sha256), self._timeout_s)
        except NotFoundError:
            return False
        self._remember(ref.sha256)
        return True

    async def get(self, ref: BlobRef) -> bytes:
        """Fetch the body of ``ref`` whole (a large one: :meth:`chunks`, :meth:`get_file`, :meth:`head_tail`).

        Raises:
            BlobMissing: no such object.
            BlobCorrupt: the object's body does not hash to ``ref.sha256`` (the reason says what it holds),
                or it is not a readable object.
            BlobTimeout: the read took longer than the store's timeout, or no server answered it.
        """
        if isinstance(ref.inline, str):
            return _inline(ref)
        result = await self._guarded(self._read(ref.sha256), ref)
        data = bytes(result.data or b"")
        _check(ref, hashlib.sha256(data).hexdigest(), len(data))
        return data

    async def get_text(self, ref: BlobRef) -> str:
        """:meth:`get`, decoded as UTF-8 (invalid bytes replaced)."""
        return (await self.get(ref)).decode("utf-8", errors="replace")

    async def chunks(self, ref: BlobRef) -> AsyncIterator[bytes]:
        """The body of ``ref`` chunk by chunk (≤ its chunk size each, 512 KiB as Reel writes them), each
        fetched when asked for; checked as it goes (see module doc).

        Raises (while iterating):
            BlobMissing: no such object, or one of its chunks is gone.
            BlobCorrupt: not a readable object, or (after the last chunk) the body is not ``ref``'s.
            BlobTimeout: one request took longer than the store's timeout (s), or no server answered it.
        """
        async for _, _, data in self._walk(ref):
            yield data

    async def _walk(self, ref: BlobRef) -> AsyncIterator[tuple[str, int, bytes]]:
        """:meth:`chunks` with each chunk's subject and stream sequence (``""``, 0 for an inline ref's body)."""
        if isinstance(ref.inline, str):
            yield "", 0, _inline(ref)
            return
        info = await self._guarded(self._obs.get_info(ref.sha256), ref)
        if info.is_link() or not info.nuid or info.chunks is None or info.chunks < 0:
            raise BlobCorrupt(f"blob {ref.sha256[:12]}… is corrupt: its meta record names no chunks of its own")
        subject, seq = f"$O.{self._bucket}.C.{info.nuid}", 1
        digest, size = hashlib.sha256(), 0
        for k in range(info.chunks):
            msg = await self._guarded(self._chunk_after(subject, seq), ref, f"chunk {k + 1} of {info.chunks}")
            data = bytes(msg.data or b"")
            seq = (msg.seq or seq) + 1
            digest.update(data)
            size += len(data)
            yield subject, seq - 1, data
        _check(ref, digest.hexdigest(), size)

    async def index(self, ref: BlobRef) -> ChunkIndex:
        """Where each chunk of ``ref``'s body is (stream sequences and byte offsets), found by one streamed
        pass that checks the body whole — so byte ranges read through it (:meth:`read_range`) are of the
        checked body: a stream sequence's message never changes.

        Raises:
            BlobMissing, BlobCorrupt, BlobTimeout: as :meth:`chunks`.
        """
        seqs: list[int] = []
        starts: list[int] = [0]
        subject, inline = "", b""
        async for where, seq, data in self._walk(ref):
            subject = where
            seqs.append(seq)
            starts.append(starts[-1] + len(data))
            inline = data if is_inline(ref) else b""
        return ChunkIndex(ref=ref, subject=subject, seqs=tuple(seqs), starts=tuple(starts), inline=inline)

    async def read_range(self, index: ChunkIndex, offset: int, length: int) -> bytes:
        """Bytes ``offset`` ≤ b < ``offset + length`` of an indexed body (clamped to it), reading only the
        chunks that hold them, each by its sequence (a Direct Get, the leader's answer if it has none).

        Raises:
            BlobMissing: a chunk is gone (purged since it was indexed).
            BlobTimeout: a request took longer than the store's timeout.
        """
        total = index.starts[-1]
        start, end = min(max(0, offset), total), min(total, max(0, offset) + max(0, length))
        if index.inline or start >= end:
            return index.inline[start:end]
        first = bisect.bisect_right(index.starts, start) - 1
        out = bytearray()
        for k in range(first, len(index.seqs)):
            if index.starts[k] >= end:
                break
            msg = await self._guarded(self._chunk_at(index.subject, index.seqs[k]), index.ref, f"chunk {k + 1}")
            data = bytes(msg.data or b"")
            if msg.subject != index.subject or len(data) != index.starts[k + 1] - index.starts[k]:
                raise BlobCorrupt(f"blob {index.ref.sha256[:12]}…: chunk {k + 1} is not the one indexed")
            out += data[max(0, start - index.starts[k]):end - index.starts[k]]
        return bytes(out)

    async def get_file(self, ref: BlobRef, into: IO[bytes] | None) -> int:
        """Stream the body of ``ref`` into ``into`` chunk by chunk (``None``: only check it), never holding it
        whole; its sha256 is checked as it comes. Returns its size (bytes).

        Raises:
            BlobMissing, BlobCorrupt, BlobTimeout: as :meth:`chunks` (``into`` may hold part of a corrupt body).
        """
        size = 0
        async for piece in self.chunks(ref):
            size += len(piece)
            if into is not None:
                into.write(piece)
        return size

    async def head_tail(self, ref: BlobRef, head_bytes: int, tail_bytes: int) -> tuple[bytes, bytes, int]:
        """The first ``head_bytes`` and the last ``tail_bytes`` of the body of ``ref``, and its size (bytes),
        streamed and checked whole; they never overlap: a body of at most ``head_bytes + tail_bytes`` is
        ``head + tail``.

        Raises:
            BlobMissing, BlobCorrupt, BlobTimeout: as :meth:`chunks`.
        """
        head, tail, tail_len, size = bytearray(), deque[bytes](), 0, 0
        async for piece in self.chunks(ref):
            size += len(piece)
            room = head_bytes - len(head)
            if room > 0:
                head += piece[:room]
                piece = piece[room:]
            if piece and tail_bytes > 0:
                tail.append(piece)
                tail_len += len(piece)
                while tail and tail_len - len(tail[0]) >= tail_bytes:
                    tail_len -= len(tail.popleft())
        rest = b"".join(tail)
        return bytes(head), rest[max(0, len(rest) - tail_bytes):] if tail_bytes else b"", size

    async def _chunk_after(self, subject: str, seq: int) -> jsapi.RawStreamMsg:
        """The first message on ``subject`` at sequence ≥ ``seq``: a Direct Get, asked of the leader if
        the answering server has none (an R3 follower may not have applied it yet)."""
        stream = f"OBJ_{self._bucket}"
        try:
            return await self._js.get_msg(stream, seq=seq, subject=subject, next=True, direct=True)
        except NotFoundError:
            return await self._js.get_msg(stream, seq=seq, subject=subject, next=True)

    async def _chunk_at(self, subject: str, seq: int) -> jsapi.RawStreamMsg:
        stream = f"OBJ_{self._bucket}"
        try:
            return await self._js.get_msg(stream, seq=seq, direct=True)
        except NotFoundError:
            return await self._js.get_msg(stream, seq=seq)

    async def _guarded(self, read: Awaitable[T], ref: BlobRef, what: str = "") -> T:
        """``read`` under the store's timeout, its failures as Reel's blob errors."""
        where = f" ({what})" if what else ""
        try:
            return await asyncio.wait_for(read, self._timeout_s)
        except NotFoundError as exc:
            raise BlobMissing(f"blob {ref.sha256[:12]}… not in bucket {self._bucket}{where}") from exc
        except TimeoutError as exc:
            raise BlobTimeout(f"reading blob {ref.sha256[:12]}…{where} took over {self._timeout_s}s") from exc
        except _UNANSWERED as exc:  # no server answered (an election, a reconnect): not a verdict on the body
            raise BlobTimeout(f"reading blob {ref.sha256[:12]}…{where}: the store did not answer "
                              f"({type(exc).__name__})") from exc
        except Exception as exc:  # a meta record that is not a readable object (bad digest, no nuid, a link…)
            raise BlobCorrupt(f"blob {ref.sha256[:12]}… is corrupt: not a readable object "
                              f"({type(exc).__name__}: {exc})"[:300]) from exc

    async def _read(self, name: str) -> ObjectStore.ObjectResult:
        """The object: its meta record, then — one chunk, the common case — that chunk by a message get (two
        requests, no consumer); several chunks through nats-py's ordered consumer.

        Raises:
            NotFoundError: no such object (or its chunk is gone).
            nats.js.errors.Error, ValueError: the meta record is not a readable plain object.
        """
        info = await self._obs.get_info(name)
        if info.chunks != 1 or not info.nuid or info.is_link():
            return await self._obs.get(name)
        msg = await self._js.get_last_msg(f"OBJ_{self._bucket}", f"$O.{self._bucket}.C.{info.nuid}")
        return ObjectStore.ObjectResult(info=info, data=bytes(msg.data or b""))


def _inline(ref: BlobRef) -> bytes:
    data = (ref.inline or "").encode("utf-8")
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise BlobCorrupt(f"inline blob {ref.sha256[:12]}… is corrupt (sha256 mismatch)")
    return data


def _check(ref: BlobRef, got: str, size: int) -> None:
    """Raises BlobCorrupt unless the body read (``size`` bytes hashing to ``got``) is ``ref``'s."""
    if got != ref.sha256:
        raise BlobCorrupt(f"blob {ref.sha256[:12]}… is corrupt: the object holds {size} bytes hashing to "
                          f"{got[:12]}… (sha256 mismatch; written under the wrong name, or overwritten)")
