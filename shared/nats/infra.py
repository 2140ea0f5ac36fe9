"""Connecting to NATS and creating Reel's streams, buckets idempotently.

Every service calls :func:`ensure_infra` at start: creating what exists already is
a no-op, and a stream whose config drifted (e.g. replicas) is updated — by a
connection allowed to (the operator, or any connection to an auth-off server); a
service role may create what is missing but not change it, so it keeps the stream
as it is and logs ``infra.config_kept`` (docs/security.md). A client, which may
create nothing, uses :func:`open_infra`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js import api as jsapi
from nats.js.errors import APIError, BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from reel.shared.auth import secrets
from reel.shared.core.errors import ReelError
from reel.shared.core.wire.subjects import COMMANDS, RUN_COMMANDS
from reel.shared.nats.access import PermissionDenied, open_connection, redact_url
from reel.shared.runtime.config import Config

log = structlog.get_logger(__name__)

DUPLICATE_WINDOW_S = 120.0
COMMAND_MAX_AGE_S = 7 * 24 * 3600.0
MAX_CONSUMERS = 1024
"""``max_consumers`` of every stream and bucket but the commands stream: the services' consumers and every
reader's ephemeral ones (a client's ordered reads, a UI's live feed) together; JetStream refuses one more with
``maximum consumers limit reached`` (docs/security.md)."""
MAX_COMMAND_CONSUMERS = 64
"""``max_consumers`` of the commands stream, plus one per executor partition: only the services' durables."""


@dataclass
class Infra:
    """Handles to everything :func:`ensure_infra` created."""

    nc: Client
    js: JetStreamContext
    blobs: ObjectStore
    leases: KeyValue
    outcomes: KeyValue
    snapshots: KeyValue


class InfraMissing(ReelError):
    """A stream or bucket Reel needs does not exist, and this connection may not create it."""

    code = "infra_missing"


async def connect(cfg: Config, name: str = "reel") -> Client:
    """Connect to ``cfg.nats_url`` (comma-separated list allowed) with ``cfg.auth``'s credentials and TLS.

    The connection is a :class:`~reel.shared.nats.access.ReelConnection`: a request the
    user may not make raises :class:`~reel.shared.nats.access.PermissionDenied` at once.

    Raises:
        ConnectRefused: the server refused the credentials (or TLS failed).
        nats.errors.NoServersError: nothing answers at that address.
    """
    secrets.remember_auth(cfg.auth)  # what this process knows of its identity is scrubbed from what it records
    secrets.remember_env(secrets.MODEL_KEY_ENV)
    servers = [s.strip() for s in cfg.nats_url.split(",") if s.strip()]
    return await open_connection(
        servers, cfg.auth, name=name, connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
        allow_reconnect=True,
    )


def storage_type(cfg: Config) -> jsapi.StorageType:
    """The JetStream storage type ``cfg.storage`` names (``file`` or ``memory``)."""
    return jsapi.StorageType.MEMORY if cfg.storage == "memory" else jsapi.StorageType.FILE


async def ensure_stream(js: JetStreamContext, config: jsapi.StreamConfig) -> None:
    """Create the stream, or update it to ``config`` if it exists with another configuration (idempotent)."""
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        if exc.err_code != 10058:  # stream name already in use with a different configuration
            raise
        try:
            await js.update_stream(config)
        except PermissionDenied:  # a service role: the operator repairs drift
            log.warning("infra.config_kept", stream=config.name, reason="this NATS user may not update streams")


def commands_stream_config(cfg: Config) -> jsapi.StreamConfig:
    """The commands stream: a work queue of every command subject; with ``cfg.names.partitions`` N ≥ 1 also
    the keyed start/resume subjects, stored under their partition by the stream's subject transform
    (``<ns>.cmd.run.<run>.<cmd>`` → ``<ns>.cmd.part.<p>.<run>.<cmd>``, NATS docs "Subject mapping and
    partitioning"; docs/architecture.md, "Executor partitions")."""
    n = cfg.names
    subjects = [n.command(c) for c in COMMANDS] + [n.command("crucible.*"), n.verify_all]
    transform = None
    if n.partitions >= 1:
        subjects += [n.run_command("*", c) for c in RUN_COMMANDS]
        src, dest = n.partition_transform()
        transform = jsapi.SubjectTransform(src=src, dest=dest)
    return jsapi.StreamConfig(
        name=n.commands_stream, subjects=subjects, subject_transform=transform,
        storage=storage_type(cfg), num_replicas=cfg.replicas,
        retention=jsapi.RetentionPolicy.WORK_QUEUE, max_age=COMMAND_MAX_AGE_S,
        duplicate_window=DUPLICATE_WINDOW_S, max_consumers=MAX_COMMAND_CONSUMERS + n.partitions,
        description="Reel commands (start, cancel, rewind, resume, recover) and verification triggers",
    )


async def ensure_infra(nc: Client, cfg: Config) -> Infra:
    """Create (or confirm) the streams, object store and KV buckets of ``cfg.names``."""
    js = nc.jetstream()
    n = cfg.names
    storage = storage_type(cfg)
    await ensure_stream(js, jsapi.StreamConfig(
        name=n.events_stream, subjects=[n.events_all], storage=storage, num_replicas=cfg.replicas,
        retention=jsapi.RetentionPolicy.LIMITS, allow_direct=True, duplicate_window=DUPLICATE_WINDOW_S,
        max_consumers=MAX_CONSUMERS,
        description="Reel run events: one subject per run, one message per commit, LSN = stream sequence",
    ))
    await ensure_stream(js, commands_stream_config(cfg))
    await ensure_stream(js, jsapi.StreamConfig(
        name=n.verdicts_stream, subjects=[n.verdicts_all], storage=storage, num_replicas=cfg.replicas,
        retention=jsapi.RetentionPolicy.LIMITS, allow_direct=True, duplicate_window=DUPLICATE_WINDOW_S,
        max_consumers=MAX_CONSUMERS, description="Reel verdicts, replayable by late consumers",
    ))
    blobs = await _object_store(js, cfg)
    leases = await _kv(js, jsapi.KeyValueConfig(
        bucket=n.lease_bucket, storage=storage, replicas=cfg.replicas, history=1, ttl=float(cfg.lease_ttl_s),
        description="Executor liveness: an entry exists while its executor heartbeats (bucket max age = TTL)",
    ))
    outcomes = await _kv(js, jsapi.KeyValueConfig(
        bucket=n.outcome_bucket, storage=storage, replicas=cfg.replicas, history=1, ttl=7 * 24 * 3600.0,
    ))
    snapshots = await _kv(js, jsapi.KeyValueConfig(
        bucket=n.snapshot_bucket, storage=storage, replicas=cfg.replicas, history=1, direct=True,  # Direct Get reads
        description="Latest folded-state snapshot per run (a shortcut for reads, never a source of truth)",
    ))
    for stream in (f"OBJ_{n.blob_bucket}", *(f"KV_{b}" for b in (n.lease_bucket, n.outcome_bucket,
                                                                   n.snapshot_bucket))):
        await cap_consumers(js, stream)
    return Infra(nc=nc, js=js, blobs=blobs, leases=leases, outcomes=outcomes, snapshots=snapshots)


async def cap_consumers(js: JetStreamContext, stream: str, max_consumers: int = MAX_CONSUMERS) -> None:
    """Set ``max_consumers`` on ``stream`` (a bucket's: nats-py creates them without one) if it differs.

    A connection that may not update streams (a service role) keeps the stream as it is and logs
    ``infra.config_kept``; the operator's next start caps it.
    """
    config = (await js.stream_info(stream)).config
    if config.max_consumers == max_consumers:
        return
    try:
        await js.update_stream(replace(config, max_consumers=max_consumers))
    except PermissionDenied:
        log.warning("infra.config_kept", stream=stream, reason="this NATS user may not update streams")


async def open_infra(nc: Client, cfg: Config) -> Infra:
    """Handles to the streams and buckets of ``cfg.names``, creating nothing (a client's view).

    Raises:
        InfraMissing: one of them does not exist (no Reel service ever ran on this namespace).
    """
    js = nc.jetstream()
    n = cfg.names
    try:
        for stream in (n.events_stream, n.commands_stream, n.verdicts_stream):
            await js.stream_info(stream)
        blobs = await js.object_store(n.blob_bucket)
        kvs = [await js.key_value(b) for b in (n.lease_bucket, n.outcome_bucket, n.snapshot_bucket)]
    except (NotFoundError, BadRequestError) as exc:
        raise InfraMissing(f"namespace {n.namespace!r} has no Reel streams at {redact_url(cfg.nats_url)} "
                           f"({exc.description or exc}): start `reel up` or a Reel service first") from None
    return Infra(nc=nc, js=js, blobs=blobs, leases=kvs[0], outcomes=kvs[1], snapshots=kvs[2])


async def _object_store(js: JetStreamContext, cfg: Config) -> ObjectStore:
    try:
        return await js.object_store(cfg.names.blob_bucket)
    except (NotFoundError, BadRequestError):
        pass
    return await js.create_object_store(cfg.names.blob_bucket, jsapi.ObjectStoreConfig(
        bucket=cfg.names.blob_bucket, storage=storage_type(cfg), replicas=cfg.replicas,
        description="Reel blobs: prompts, outputs, workflows; named by sha256",
    ))


async def _kv(js: JetStreamContext, config: jsapi.KeyValueConfig) -> KeyValue:
    try:
        return await js.key_value(config.bucket)
    except (NotFoundError, BadRequestError):
        return await js.create_key_value(config)


START_RETRY_S = 120.0
"""How long (s) a service retries :func:`ensure_infra` at start (a loaded cluster, an election)."""

CLUSTER_UNAVAILABLE = frozenset({10005, 10008, 10009, 10023})
"""JetStream ``err_code``s of a cluster that cannot place or answer for a stream *yet*: 10005 no suitable
peers for placement (a **400**: too few servers up for the replicas asked), 10008 cluster not available,
10009 not the leader, 10023 insufficient resources (nats-server ``server/errors.json``). At start they mean
"wait for quorum", not "bad request"."""


def setup_retryable(exc: BaseException) -> bool:
    """True for an error :func:`ensure_infra_retrying` waits out: transient (timeout, no responders, 503), any
    5xx answer, or a :data:`CLUSTER_UNAVAILABLE` code whatever its HTTP-like code."""
    from reel.shared.nats.publish import is_transient

    return is_transient(exc) or (isinstance(exc, APIError) and (
        (exc.code or 0) >= 500 or (exc.err_code or 0) in CLUSTER_UNAVAILABLE))


async def ensure_infra_retrying(nc: Client, cfg: Config, *, within_s: float = START_RETRY_S) -> Infra:
    """:func:`ensure_infra`, retried with backoff (tenacity: jittered, ≤ 2 s apart) for ``within_s`` seconds on
    the errors of a loaded or electing cluster or one without quorum yet (:func:`setup_retryable`) — the start of
    every service.

    Raises:
        the last error of :func:`ensure_infra` once ``within_s`` is over, or at once if it is not transient.
    """
    import tenacity

    def logged(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("infra.retry", try_no=state.attempt_number, error=repr(exc)[:200])

    async for attempt in tenacity.AsyncRetrying(
            stop=tenacity.stop_after_delay(within_s), wait=tenacity.wait_random_exponential(multiplier=0.2, max=2.0),
            retry=tenacity.retry_if_exception(setup_retryable), reraise=True, after=logged):
        with attempt:
            return await ensure_infra(nc, cfg)
    raise AssertionError("unreachable")  # pragma: no cover
