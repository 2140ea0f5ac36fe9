"""Acked publishes to JetStream subjects, pipelined (several in flight share one round trip), and the
commands a service queues for another (:func:`publish_resume`, :func:`publish_verify`).

A publish during a leader election (R3: 4–8 s, brief §10) times out or finds no responders; the one
settle policy (:func:`settle_retrying`, tenacity) sends it again with the same ``Nats-Msg-Id`` for up
to :data:`SETTLE_S` — inside the streams' 120 s duplicate window, so a retry of a publish that did land
is deduplicated.
"""

from __future__ import annotations

import asyncio
import json

import nats.errors
import structlog
import tenacity
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError

from shared.core.commands import ResumeRun, VerifyRun, encode
from shared.core.errors import ReelError
from shared.core.ids import LSN, BranchId, RunId
from shared.core.subjects import MSG_ID_HEADER, Names, verify_msg_id

log = structlog.get_logger(__name__)

SETTLE_S = 60.0
"""How long (s) a publish or read is retried while the stream cannot answer (an election); < the 120 s
duplicate window."""


class StreamUnavailable(ReelError):
    """No server answered for the stream (503 no responders: a node died, an election under way); retried."""

    code = "stream_unavailable"
    retryable = True


_TRANSIENT = (nats.errors.TimeoutError, nats.errors.NoRespondersError, NoStreamResponseError, TimeoutError,
              nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError, StreamUnavailable)


def is_transient(exc: BaseException) -> bool:
    """True for the errors an election or a failover gives (timeout, no responders, 503, reconnecting):
    the same request may be sent again."""
    return isinstance(exc, _TRANSIENT) or (isinstance(exc, APIError) and exc.code == 503)


def _log_retry(state: tenacity.RetryCallState) -> None:
    if state.attempt_number in (1, 5, 20) or state.attempt_number % 50 == 0:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("nats.retry", try_no=state.attempt_number, error=repr(exc)[:200])


def settle_retrying(settle_s: float = SETTLE_S) -> tenacity.AsyncRetrying:
    """The one policy for a request an election can interrupt: retried on :func:`is_transient` errors with
    jittered exponential waits (≤ 1 s) for ``settle_s`` seconds, then the last error is raised."""
    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_delay(settle_s),
        wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
        retry=tenacity.retry_if_exception(is_transient), reraise=True, after=_log_retry,
    )


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
    """Queue ``ResumeRun`` for an executor, deduplicated per (run, LSN that made it needed); sent again with
    the same id through an election (:func:`settle_retrying`); keyed by the run (its partition's executor)
    when ``names.partitions`` ≥ 1."""
    subject = names.run_command(run_id, "resume") if names.partitions >= 1 else names.command("resume")
    async for attempt in settle_retrying():
        with attempt:
            await js.publish(subject, encode(ResumeRun(run_id=RunId(run_id))),
                             headers={MSG_ID_HEADER: f"resume:{run_id}:{at_lsn}"})


async def publish_verify(js: JetStreamContext, names: Names, run_id: str, branch_id: str, snapshot_lsn: int) -> None:
    """Queue the verification trigger of a run that committed ``run_verifying`` at ``snapshot_lsn``
    (deduplicated per (run, LSN): a re-trigger within the stream's duplicate window is dropped).

    Raises:
        nats.errors.TimeoutError, nats.js.errors.APIError: the trigger was not stored (recovery re-triggers).
    """
    cmd = VerifyRun(run_id=RunId(run_id), branch_id=BranchId(branch_id), snapshot_lsn=LSN(snapshot_lsn))
    async for attempt in settle_retrying():
        with attempt:
            await js.publish(names.verify(run_id), encode(cmd),
                             headers={MSG_ID_HEADER: verify_msg_id(run_id, snapshot_lsn)})
