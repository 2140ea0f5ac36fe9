"""Acked publishes to JetStream subjects, pipelined (several in flight share one round trip)."""

from __future__ import annotations

import asyncio
import json

from nats.aio.client import Client
from nats.js.api import PubAck
from nats.js.errors import APIError


async def request_ack(nc: Client, subject: str, body: bytes, headers: dict[str, str] | None,
                      timeout_s: float) -> PubAck:
    """Publish to a stream subject and wait for its PubAck (one request on the shared reply inbox).

    Raises:
        nats.js.errors.APIError: the server refused the message (e.g. 10071).
        nats.errors.TimeoutError: no ack within ``timeout_s``.
    """
    resp = await nc.request(subject, body, timeout=timeout_s, headers=headers)
    data = json.loads(resp.data)
    if "error" in data:
        APIError.from_error(data["error"])  # raises the typed subclass
    return PubAck.from_response(data)


def publish_pipelined(
    nc: Client, subject: str, body: bytes, headers: dict[str, str] | None, timeout_s: float
) -> asyncio.Future[PubAck]:
    """Publish to a stream subject now; the future resolves to the PubAck (see :func:`request_ack`).

    Several of these in flight at once share one round trip. (nats-py's own
    ``publish_async`` cannot be used: it loses error acks such as 10071.)
    """
    return asyncio.ensure_future(request_ack(nc, subject, body, headers, timeout_s))
