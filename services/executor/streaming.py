"""Streamed model responses (a model spec's ``stream: true``): each fragment out on core NATS as it arrives;
and an MCP tool call's progress (:meth:`StreamOut.progress`), on the call attempt's subject.

The adapter hands every fragment of the response to a :class:`StreamOut` (its ``on_delta``),
which publishes it on the attempt's subject ``<ns>.stream.<run>.<branch>.<step>.<attempt>``
(:meth:`reel.shared.core.wire.subjects.Names.stream`) numbered 0, 1, …; when the call ends,
:func:`streamed` publishes the last message (``done``, with the finish reason, or the error
kind: a broken stream, a failed call, an interrupted attempt — a retry streams on its own
subject). Nothing here is stored: the log keeps the consolidated response (the output blob),
which is where a consumer that joins late reads it. Publishing is best effort and never
fails the attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import structlog
from nats.aio.client import Client

from reel.shared.core.errors import ModelError
from reel.shared.core.wire.livemessages import StreamChunk, ToolProgress, encode_live

from .interrupts import Interrupted

log = structlog.get_logger("reel.executor")

T = TypeVar("T")


class StreamOut:
    """One attempt's stream: ``await out(chunk)`` publishes a fragment (renumbered), :meth:`end` the last message."""

    def __init__(self, nc: Client, subject: str) -> None:
        self.nc, self.subject = nc, subject
        self.sent = 0
        self._failed = False

    async def __call__(self, chunk: StreamChunk) -> None:
        await self._publish(msgspec.structs.replace(chunk, seq=self.sent))

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """A tool call's progress (an MCP server's ``notifications/progress``), as a fragment of its own."""
        await self._publish(StreamChunk(seq=self.sent, progress=ToolProgress(progress=progress, total=total,
                                                                             message=message or "")))

    async def end(self, *, finish_reason: str | None = None, error: str | None = None) -> None:
        """The attempt's last message (``done``): its finish reason, or what ended it."""
        await self._publish(StreamChunk(seq=self.sent, done=True, finish_reason=finish_reason, error=error))

    async def _publish(self, chunk: StreamChunk) -> None:
        self.sent += 1
        try:
            await self.nc.publish(self.subject, encode_live(chunk))
        except Exception as exc:  # a stream subscriber's convenience: never the attempt's failure
            if not self._failed:
                self._failed = True
                log.warning("stream.publish_failed", subject=self.subject, error=str(exc))


async def streamed(call: Awaitable[T], out: StreamOut | None, finish: Callable[[T], str | None]) -> T:
    """Await the model ``call`` (which streams into ``out``); then publish ``out``'s last message.

    Raises:
        whatever ``call`` raises (after the last message names it).
    """
    if out is None:
        return await call
    try:
        result = await call
    except BaseException as exc:  # a failed call, a broken stream, an interrupted attempt, an adapter's bug
        kind = exc.kind if isinstance(exc, ModelError) else (
            Interrupted("cancelled").kind if isinstance(exc, asyncio.CancelledError) else "adapter_error")
        await out.end(error=kind)
        raise
    await out.end(finish_reason=finish(result))
    return result
