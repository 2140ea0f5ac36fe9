"""The executor's one cache of blob bodies: earlier outputs, turns' messages, results, large arguments.

A step's context needs the outputs of earlier steps, an agent turn's every earlier turn's
message and results: each body is read from the blob store at most once per executor (while
it stays in this LRU), and a body this executor wrote is kept as it is written.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence

from reel.shared.core.ports import BlobStore
from reel.shared.core.run.events import BlobRef

BODY_CACHE_BYTES = 64 * 1024 * 1024


class Bodies:
    """Blob bodies by sha256 (LRU of at most ``max_bytes`` bytes), read through to the blob store."""

    def __init__(self, blobs: BlobStore, max_bytes: int = BODY_CACHE_BYTES) -> None:
        self.blobs, self._max = blobs, max_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def keep(self, body: bytes, ref: BlobRef) -> None:
        """Remember ``body`` (stored, or about to be, as ``ref``)."""
        if ref.sha256 in self._cache:
            self._cache.move_to_end(ref.sha256)
            return
        self._cache[ref.sha256] = body
        self._bytes += len(body)
        while self._bytes > self._max and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._bytes -= len(old)

    def peek(self, ref: BlobRef) -> bytes | None:
        """The body of ``ref`` if it is cached (no read), else ``None``."""
        body = self._cache.get(ref.sha256)
        if body is not None:
            self._cache.move_to_end(ref.sha256)
        return body

    async def get(self, ref: BlobRef) -> bytes:
        """The body of ``ref``.

        Raises:
            BlobMissing, BlobCorrupt, BlobTimeout: from the store (:meth:`BlobStore.get`).
        """
        body = self._cache.get(ref.sha256)
        if body is None:
            body = await self.blobs.get(ref)
        self.keep(body, ref)
        return body

    async def many(self, refs: Sequence[BlobRef]) -> dict[str, bytes]:
        """sha256 → body of every ref (the missing ones read concurrently). Raises as :meth:`get`."""
        out: dict[str, bytes] = {}
        missing: list[BlobRef] = []
        for r in refs:  # a cached body costs no task (an agent turn asks for every earlier turn's)
            body = self._cache.get(r.sha256)
            if body is None:
                missing.append(r)
            else:
                self._cache.move_to_end(r.sha256)
                out[r.sha256] = body
        if missing:
            bodies = await asyncio.gather(*(self.get(r) for r in missing))
            out.update((r.sha256, b) for r, b in zip(missing, bodies, strict=True))
        return out
