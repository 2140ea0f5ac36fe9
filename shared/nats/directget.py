"""Batched Direct Gets on one reply subscription per connection (a performance adapter of SubjectLog).

A Direct Get (``$JS.API.DIRECT.GET.<stream>``, ADR-31) answers on the request's reply subject: one
message per stored message, then an end-of-batch status (``404``/``204``/``408``) for a batch. A
subscription per read costs a ``SUB`` and an ``UNSUB`` on the wire and a subscription task in nats-py
(≈ 0.2–0.3 ms of CPU per read on a 2-core machine, bench/w_kr.py); :class:`DirectReplies` keeps one
wildcard subscription ``<inbox>.*`` per connection instead (as nats-py does for its requests) and routes
each reply by its last token to the read that asked.

A reply for a read that has already timed out finds no reader and is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from reel.shared.core.errors import ReelError
from reel.shared.nats.access import fail_if_denied
from reel.shared.nats.publish import StreamUnavailable

END_OF_BATCH = ("404", "204", "408")


@dataclass
class _Read:
    """One read in flight: its messages so far, and the future that ends it."""

    api_subject: str
    single: bool
    done: asyncio.Future[None]
    out: list[Msg] = field(default_factory=list)


class DirectReplies:
    """The reply subscription of one connection, shared by every Direct Get on it (see module doc)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._sub: Subscription | None = None
        self._prefix = ""
        self._reads: dict[str, _Read] = {}
        self._tokens = itertools.count(1)
        self._lock = asyncio.Lock()

    async def _subscribed(self) -> str:
        if self._sub is None:
            async with self._lock:
                if self._sub is None:
                    prefix = self._nc.new_inbox()
                    self._sub = await self._nc.subscribe(prefix + ".*", cb=self._on_reply)
                    self._prefix = prefix
        return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        read = self._reads.get(msg.subject[len(self._prefix) + 1:])
        if read is None or read.done.done():
            return
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is None:
            read.out.append(msg)
            if read.single:
                read.done.set_result(None)
        elif status in END_OF_BATCH:
            read.done.set_result(None)
        elif status == "503":
            read.done.set_exception(StreamUnavailable(f"no responders for {read.api_subject}"))
        else:
            read.done.set_exception(ReelError(f"direct get failed: {status} {headers.get('Description')}"))

    async def get(self, api_subject: str, payload: bytes, *, single: bool, timeout_s: float) -> list[Msg]:
        """Send one Direct Get request and collect its answer: the messages before the end-of-batch status
        (``single``: the first message; none if not found).

        Raises:
            StreamUnavailable: the stream has no responder (503; an election).
            ReelError: any other error status.
            PermissionDenied: the request is refused by the server's permissions.
            TimeoutError: no complete answer within ``timeout_s`` seconds.
        """
        prefix = await self._subscribed()
        token = str(next(self._tokens))
        read = _Read(api_subject=api_subject, single=single, done=asyncio.get_running_loop().create_future())
        self._reads[token] = read
        fail_if_denied(self._nc, api_subject, read.done)  # a refused read fails now, not at the timeout
        try:
            await self._nc.publish(api_subject, payload, reply=f"{prefix}.{token}")
            await asyncio.wait_for(read.done, timeout_s)
        finally:
            del self._reads[token]
        return read.out


_BY_CONNECTION: weakref.WeakKeyDictionary[Client, DirectReplies] = weakref.WeakKeyDictionary()


def direct_replies(nc: Client) -> DirectReplies:
    """The :class:`DirectReplies` of connection ``nc`` (made on first use)."""
    got = _BY_CONNECTION.get(nc)
    if got is None:
        got = _BY_CONNECTION[nc] = DirectReplies(nc)
    return got
