"""The consumer gate: a client's consumer-create requests, vetted, forwarded to JetStream (docs/security.md).

The client account imports ``JS.<NS>.API.CONSUMER.CREATE.<stream>`` (a client's JetStream API prefix)
as the Reel-account subject :meth:`~reel.shared.core.wire.subjects.Names.consumer_gate` (shared/auth/roles.py), where
every mutator service (rewind, cancel, recovery) answers it in one queue group. Each request is vetted
(:func:`reel.shared.core.wire.consumerrules.vet`): an admissible one is forwarded, re-encoded, to
``$JS.API.CONSUMER.CREATE.<stream>`` and JetStream's answer relayed; any other gets a JetStream API error
(code 403, ``consumer_refused: …``) — what nats-py raises as ``APIError`` — and ``consumer_gate.refused`` is
logged. Nothing of the request is stored or acted on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from reel.shared.core.wire.consumerrules import Refused, vet
from reel.shared.core.wire.subjects import Names

log = structlog.get_logger(__name__)

QUEUE = "reel-consumer-gate"
FORWARD_TIMEOUT_S = 4.0
"""How long the gate waits for JetStream's answer (s): less than a client's JetStream API timeout (5 s)."""

RESPONSE_TYPE = "io.nats.jetstream.api.v1.consumer_create_response"


def gated_streams(names: Names) -> tuple[str, ...]:
    """The streams a client may create consumers on: events, verdicts, blobs (it reads them)."""
    return names.events_stream, names.verdicts_stream, f"OBJ_{names.blob_bucket}"


def api_error(code: int, description: str) -> bytes:
    """A JetStream API error answer (``{"type", "error": {"code", "err_code", "description"}}``)."""
    return json.dumps({"type": RESPONSE_TYPE, "error": {"code": code, "err_code": 10000 + code,
                                                        "description": description}}).encode()


@contextlib.asynccontextmanager
async def consumer_gate(nc: Client, names: Names) -> AsyncIterator[None]:
    """Answer :meth:`~Names.consumer_gate_all` on ``nc`` while the block runs (see the module doc)."""
    readable = gated_streams(names)
    tasks: set[asyncio.Task[None]] = set()

    async def on_msg(msg: Msg) -> None:
        task = asyncio.create_task(_answer(nc, msg, readable))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    sub = await nc.subscribe(names.consumer_gate_all, queue=QUEUE, cb=on_msg)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        for t in list(tasks):
            t.cancel()


async def _answer(nc: Client, msg: Msg, readable: tuple[str, ...]) -> None:
    if not msg.reply:
        return
    stream = msg.subject.rsplit(".", 1)[-1]
    decision = vet(stream, msg.data, readable)
    if isinstance(decision, Refused):
        log.warning("consumer_gate.refused", stream=stream, reason=decision.reason)
        answer = api_error(403, f"consumer_refused: {decision.reason}")
    else:
        try:
            answer = bytes((await nc.request(f"$JS.API.CONSUMER.CREATE.{stream}", decision.body,
                                             timeout=FORWARD_TIMEOUT_S)).data)
        except Exception as exc:  # the client gets an error answer, never silence
            log.warning("consumer_gate.forward_failed", stream=stream, error=str(exc)[:200])
            answer = api_error(503, f"consumer gate: JetStream did not answer ({type(exc).__name__})")
    with contextlib.suppress(Exception):
        await msg.respond(answer)
