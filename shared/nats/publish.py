"""Acked publishes to JetStream subjects, pipelined (several in flight share one round trip), and the
commands a service queues for another (:func:`publish_resume`, :func:`publish_verify`).

A publish during a leader election (R3: 4–8 s) times out or finds no responders; the one
settle policy (:func:`settle_retrying`, tenacity) sends it again with the same ``Nats-Msg-Id`` for up
to :data:`SETTLE_S` — inside the streams' 120 s duplicate window, so a retry of a publish that did land
is deduplicated.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import structlog
import tenacity
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from reel.shared.core.errors import ReelError
from reel.shared.core.run.ids import LSN, BranchId, RunId
from reel.shared.core.wire.commands import ResumeRun, VerifyRun, encode
from reel.shared.core.wire.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER, MSG_ID_HEADER, Names, verify_msg_id

log = structlog.get_logger(__name__)
T = TypeVar("T")

WRONG_LAST_SEQUENCE = 10071
SETTLE_S = 60.0
"""How long (s) a publish or read is retried while the stream cannot answer (an election); < the 120 s
duplicate window."""


class StreamUnavailable(ReelError):
    """No server answered for the stream (503 no responders: a node died, an election under way); retried."""

    code = "stream_unavailable"
    retryable = True


STORE_FULL_CODES: dict[int, str] = {
    10023: "insufficient resources (the server's max_file_store / max_memory_store is used up)",
    10047: "insufficient storage resources available (the account's JetStream storage limit)",
    10028: "insufficient memory resources available (the account's JetStream memory limit)",
}
"""JetStream ``err_code``s of a write refused because the store is full (nats-server ``server/errors.json``)."""


class StoreFull(ReelError):
    """JetStream refused a write: its storage limit is reached (:data:`STORE_FULL_CODES`). Retryable: the same
    write succeeds once space is freed (docs/operations.md, "A full store").

    Attributes:
        err_code: the server's JetStream error code (e.g. 10023); description: the server's words.
    """

    code = "store_full"
    retryable = True

    def __init__(self, err_code: int, description: str, subject: str = "") -> None:
        where = f" to {subject}" if subject else ""
        super().__init__(f"JetStream refused the write{where}: store full (err_code {err_code} {description!r}); "
                         "free space or raise the limit (docs/operations.md, \"A full store\")")
        self.err_code, self.description = err_code, description


def store_full(exc: BaseException, subject: str = "") -> StoreFull | None:
    """``exc`` as :class:`StoreFull` if it is a JetStream refusal for a full store (else ``None``)."""
    if isinstance(exc, StoreFull):
        return exc
    if isinstance(exc, APIError) and exc.err_code in STORE_FULL_CODES:
        return StoreFull(exc.err_code, exc.description or STORE_FULL_CODES[exc.err_code], subject)
    return None


class StoreHealth:
    """What this process last saw of the store: the latest :class:`StoreFull` refusal, cleared by the next
    write JetStream acked (:func:`request_ack` keeps it). NATS micro STATS report it (``store_full`` in the
    metadata, shared/nats/micro.py), so ``reel status`` names a full store while the services wait on it."""

    def __init__(self) -> None:
        self.full: StoreFull | None = None
        self.since_s: float | None = None

    def note_full(self, full: StoreFull) -> None:
        """A write was refused for a full store."""
        if self.full is None:
            self.since_s = time.time()
        self.full = full

    def note_ok(self) -> None:
        """A write was acked: the store has room."""
        self.full, self.since_s = None, None

    def report(self) -> str | None:
        """``store_full: err_code N '…' since <epoch s>`` while full, else ``None``."""
        if self.full is None:
            return None
        return f"store_full: err_code {self.full.err_code} {self.full.description!r} since {self.since_s:.0f}"


STORE = StoreHealth()
"""This process's :class:`StoreHealth`."""


_TRANSIENT = (nats.errors.TimeoutError, nats.errors.NoRespondersError, NoStreamResponseError, TimeoutError,
              nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError,
              nats.errors.OutboundBufferLimitError, StreamUnavailable, StoreFull)


def is_transient(exc: BaseException) -> bool:
    """True for the errors an election, a failover or a server outage gives (timeout, no responders, 503,
    reconnecting, the client's reconnect buffer full) or a full store (:class:`StoreFull`, a 503 too: space
    may be freed): the same request may be sent again. A closed
    connection (``ConnectionClosedError``) is not: it was closed on purpose and never comes back."""
    return isinstance(exc, _TRANSIENT) or (isinstance(exc, APIError) and exc.code == 503)


def _log_retry(state: tenacity.RetryCallState) -> None:
    if state.attempt_number in (1, 5, 20) or state.attempt_number % 50 == 0:
        exc = state.outcome.exception() if state.outcome else None
        full = store_full(exc) if exc is not None else None
        if full is not None:
            log.warning("store.full", try_no=state.attempt_number, err_code=full.err_code, reason=full.message)
        else:
            log.warning("nats.retry", try_no=state.attempt_number, error=repr(exc)[:200])


def settle_retrying(settle_s: float = SETTLE_S) -> tenacity.AsyncRetrying:
    """The one policy for a request an election can interrupt: retried on :func:`is_transient` errors with
    jittered exponential waits (≤ 1 s) for ``settle_s`` seconds, then the last error is raised."""
    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_delay(settle_s),
        wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
        retry=tenacity.retry_if_exception(is_transient), reraise=True, after=_log_retry,
    )


async def settled(call: Callable[[], Awaitable[T]], settle_s: float = SETTLE_S) -> T:
    """``call()``'s result; a try that meets a transient error (:func:`is_transient`) is made again under
    :func:`settle_retrying`. The first try runs without the retry machinery (building a tenacity policy cost
    more than the publish it guards): the common case answers at once.

    Raises:
        Exception: what ``call`` raised that is not transient, or the last transient error after ``settle_s``.
    """
    try:
        return await call()
    except Exception as exc:
        if not is_transient(exc):
            raise
    async for attempt in settle_retrying(settle_s):
        with attempt:
            return await call()
    raise AssertionError("unreachable")  # pragma: no cover


async def request_ack(nc: Client, subject: str, body: bytes, headers: dict[str, str] | None,
                      timeout_s: float) -> PubAck:
    """Publish to a stream subject and wait for its PubAck (one request on the shared reply inbox).

    Raises:
        StoreFull: the server's (or the account's) JetStream storage is used up (10023, 10047).
        nats.js.errors.APIError: the server refused the message (e.g. 10071).
        nats.errors.TimeoutError: no ack within ``timeout_s``.
    """
    resp = await nc.request(subject, body, timeout=timeout_s, headers=headers)
    data = json.loads(resp.data)
    if "error" in data:
        try:
            APIError.from_error(data["error"])  # raises the typed subclass
        except APIError as exc:
            full = store_full(exc, subject)
            if full is not None:
                STORE.note_full(full)
                raise full from exc
            raise
    STORE.note_ok()
    return PubAck.from_response(data)


def publish_pipelined(
    nc: Client, subject: str, body: bytes, headers: dict[str, str] | None, timeout_s: float, *,
    settle_s: float = SETTLE_S,
) -> asyncio.Future[PubAck]:
    """Publish to a stream subject now; the future resolves to the PubAck (see :func:`request_ack`).

    Several of these in flight at once share one round trip. (nats-py's own
    ``publish_async`` cannot be used: it loses error acks such as 10071.) A try that gets no ack within
    ``timeout_s`` or meets an outage (:func:`is_transient`) is sent again, the same message with the same
    ``Nats-Msg-Id`` (one is given if ``headers`` has none), until it settles or ``settle_s`` seconds
    have passed (:func:`settle_retrying`): a retry of a message that did land is deduplicated by the
    stream, so a blob chunk is never stored twice.

    Raises (from the future):
        nats.js.errors.APIError: the server refused the message (not retried: e.g. 10071).
        nats.errors.TimeoutError: (or another transient error) still no ack after ``settle_s``.
    """
    if headers is None or MSG_ID_HEADER not in headers:
        headers = {**(headers or {}), MSG_ID_HEADER: nc._nuid.next().decode()}
    first = request_ack(nc, subject, body, headers, timeout_s)
    return asyncio.ensure_future(_settled(nc, subject, body, headers, timeout_s, settle_s, first))


async def _settled(nc: Client, subject: str, body: bytes, headers: dict[str, str], timeout_s: float,
                   settle_s: float, first: Awaitable[PubAck]) -> PubAck:
    """The ack of the ``first`` try, else of the same message sent again until it settles."""
    try:
        return await first
    except Exception as exc:
        if not is_transient(exc):
            raise
        log.warning("publish.resend", subject=subject, error=repr(exc)[:200])
    async for attempt in settle_retrying(settle_s):
        with attempt:
            try:
                return await request_ack(nc, subject, body, headers, timeout_s)
            except APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE or EXPECTED_LAST_SUBJECT_SEQ_HEADER not in headers:
                    raise
                landed = await _landed_last(nc, subject, headers[MSG_ID_HEADER])
                if landed is None:
                    raise
                return landed
    raise AssertionError("unreachable")  # pragma: no cover


async def _landed_last(nc: Client, subject: str, msg_id: str) -> PubAck | None:
    """The ack of message ``msg_id`` if it is the last one on ``subject`` (a fenced message whose first try
    landed: on one node the fence is checked before the duplicate window, so its resend is refused 10071)."""
    js = nc.jetstream()
    stream = await js.find_stream_name_by_subject(subject)
    try:
        last = await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None
    if (last.headers or {}).get(MSG_ID_HEADER) != msg_id:
        return None
    return PubAck(stream=stream, seq=int(last.seq or 0), duplicate=True)


async def publish_resume(js: JetStreamContext, names: Names, run_id: str, at_lsn: int) -> None:
    """Queue ``ResumeRun`` for an executor, deduplicated per (run, LSN that made it needed); sent again with
    the same id through an election (:func:`settle_retrying`); keyed by the run (its partition's executor)
    when ``names.partitions`` ≥ 1."""
    subject = names.run_command(run_id, "resume") if names.partitions >= 1 else names.command("resume")
    await settled(lambda: js.publish(subject, encode(ResumeRun(run_id=RunId(run_id))),
                                     headers={MSG_ID_HEADER: f"resume:{run_id}:{at_lsn}"}))


async def publish_verify(js: JetStreamContext, names: Names, run_id: str, branch_id: str, snapshot_lsn: int) -> None:
    """Queue the verification trigger of a run that committed ``run_verifying`` at ``snapshot_lsn``
    (deduplicated per (run, LSN): a re-trigger within the stream's duplicate window is dropped).

    Raises:
        nats.errors.TimeoutError, nats.js.errors.APIError: the trigger was not stored (recovery re-triggers).
    """
    cmd = VerifyRun(run_id=RunId(run_id), branch_id=BranchId(branch_id), snapshot_lsn=LSN(snapshot_lsn))
    await settled(lambda: js.publish(names.verify(run_id), encode(cmd),
                                     headers={MSG_ID_HEADER: verify_msg_id(run_id, snapshot_lsn)}))
