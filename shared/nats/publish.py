"""Acked publishes to JetStream subjects, pipelined (several in flight share one round trip), and the
commands a service queues for another (:func:`publish_resume`, :func:`publish_verify`)."""

from __future__ import annotations

import asyncio
import json

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

from shared.core.commands import ResumeRun, VerifyRun, encode
from shared.core.ids import LSN, BranchId, RunId
from shared.core.subjects import MSG_ID_HEADER, Names, verify_msg_id


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


async def publish_resume(js: JetStreamContext, names: Names, run_id: str, at_lsn: int) -> None:
    """Queue ``ResumeRun`` for an executor, deduplicated per (run, LSN that made it needed)."""
    await js.publish(names.command("resume"), encode(ResumeRun(run_id=RunId(run_id))),
                     headers={MSG_ID_HEADER: f"resume:{run_id}:{at_lsn}"})


async def publish_verify(js: JetStreamContext, names: Names, run_id: str, branch_id: str, snapshot_lsn: int) -> None:
    """Queue the verification trigger of a run that committed ``run_verifying`` at ``snapshot_lsn``
    (deduplicated per (run, LSN): a re-trigger within the stream's duplicate window is dropped).

    Raises:
        nats.errors.TimeoutError, nats.js.errors.APIError: the trigger was not stored (recovery re-triggers).
    """
    cmd = VerifyRun(run_id=RunId(run_id), branch_id=BranchId(branch_id), snapshot_lsn=LSN(snapshot_lsn))
    await js.publish(names.verify(run_id), encode(cmd), headers={MSG_ID_HEADER: verify_msg_id(run_id, snapshot_lsn)})
