"""Every Reel service as a NATS micro service: ``$SRV.PING``, ``$SRV.INFO``, ``$SRV.STATS`` (NATS ADR-32).

A service instance registers under its own name (``reel-executor``, ``reel-verifier``,
``reel-rewind``, ``reel-cancel``, ``reel-recovery``, ``reel-crucible``) with nats-py's
``nats.micro``, on the connection it consumes with, when its :class:`~reel.shared.nats.consumer.CommandConsumer`
starts (:func:`register`); it answers discovery until the consumer stops.

Reel's commands arrive through a JetStream durable pull consumer, not as core-NATS
requests, so they are not micro *request* endpoints. They are listed in ``INFO`` and
``STATS`` all the same, one endpoint per consumed subject (``start``, ``resume``,
``verify`` …), with its ``subject``, ``queue_group`` = the durable consumer's name and
``metadata`` ``{"transport": "jetstream", "stream": …, "durable": …}`` saying so; their
``num_requests``/``num_errors``/``processing_time`` (ns) are the deliveries the consumer
shell handled (:class:`Counters`, counted in one place: ``CommandConsumer._handle``). An
error is a refusal answered with an error reply (:func:`note_refusal`, called by the
``Router``), a handler that raised, or a delivery nak'ed or terminated.

The instance id is the service's own id where it has one (an executor's ``x-…`` id, which
names its lease; a verifier's instance id), else micro's random one. Service metadata:
``namespace`` (discovery on a shared server filters on it), ``stream``, ``durable``,
``subjects`` (comma-separated), ``host``, ``pid``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.micro.service import EndpointInfo, EndpointStats, Service, ServiceConfig, ServiceInfo, ServiceStats

from reel.shared.core.wire.subjects import is_token, subject_matches
from reel.shared.nats.publish import STORE

log = structlog.get_logger(__name__)

SERVICE_PREFIX = "reel-"
"""Every Reel micro service's name starts with it: ``reel-<service>``."""


def version() -> str:
    """The installed ``reel`` package's version (``0.0.0`` when run from a tree that is not installed)."""
    try:
        return metadata.version("reel")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@dataclass
class EndpointCounts:
    """What one consumed subject's deliveries came to: counts, total handling time (ns), the last error."""

    num_requests: int = 0
    num_errors: int = 0
    processing_time_ns: int = 0
    last_error: str = ""




@dataclass
class Counters:
    """Per consumed subject (the consumer's filter subjects, wildcards allowed): :class:`EndpointCounts`."""

    subjects: list[str]
    by_subject: dict[str, EndpointCounts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for s in self.subjects:
            self.by_subject.setdefault(s, EndpointCounts())

    def record(self, subject: str, elapsed_ns: int, error: str | None) -> None:
        """Count one delivery on ``subject`` (counted under the first filter subject it matches)."""
        key = subject if subject in self.by_subject else next(
            (s for s in self.subjects if subject_matches(s, subject)), subject)
        c = self.by_subject.setdefault(key, EndpointCounts())
        c.num_requests += 1
        c.processing_time_ns += max(0, elapsed_ns)
        if error is not None:
            c.num_errors += 1
            c.last_error = error[:200]


@dataclass
class DeliveryReport:
    """What the handler of one delivery reported besides its ack decision (a refusal's ``code: message``)."""

    error: str | None = None


_outcome: contextvars.ContextVar[DeliveryReport | None] = contextvars.ContextVar("reel_delivery_outcome", default=None)


def begin_delivery() -> DeliveryReport:
    """Start collecting the outcome of the delivery handled in this task (the consumer shell calls it)."""
    out = DeliveryReport()
    _outcome.set(out)
    return out


def note_refusal(code: str, message: str) -> None:
    """Report that the delivery in hand was refused with an error reply (no-op outside a delivery)."""
    out = _outcome.get()
    if out is not None:
        out.error = f"{code}: {message}"


def endpoint_name(subject: str) -> str:
    """A micro endpoint name for a consumed subject: its tokens after ``<ns>.cmd.``, wildcards left out,
    joined by ``-`` (``reel.cmd.crucible.run`` → ``crucible-run``, ``reel.cmd.verify.*`` → ``verify``)."""
    tokens = subject.split(".")
    rest = tokens[2:] if len(tokens) > 2 and tokens[1] == "cmd" else tokens
    name = "-".join(t for t in rest if t not in ("*", ">"))
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or "command"


class ReelService(Service):
    """A micro service whose INFO and STATS also list the JetStream-consumed subjects (see module doc)."""

    def __init__(self, nc: Client, config: ServiceConfig, counters: Counters, *, durable: str, stream: str,
                 instance_id: str | None = None, report: Callable[[], dict[str, str]] | None = None) -> None:
        super().__init__(nc, config)
        if instance_id and is_token(instance_id):
            self._id = instance_id
        self.counters, self.durable, self.stream, self.report = counters, durable, stream, report

    def _consumed(self) -> dict[str, str]:
        return {"transport": "jetstream", "stream": self.stream, "durable": self.durable}

    def info(self) -> ServiceInfo:
        """micro's INFO, with one endpoint per consumed subject."""
        info = super().info()
        info.endpoints = [*info.endpoints, *(
            EndpointInfo(name=endpoint_name(s), subject=s, queue_group=self.durable, metadata=self._consumed())
            for s in self.counters.by_subject)]
        return info

    def stats(self) -> ServiceStats:
        """micro's STATS, with the consumed subjects' counts (processing times in ns) and, while this process's
        writes are refused for a full store, ``store_full`` in the metadata (:data:`reel.shared.nats.publish.STORE`)."""
        stats = super().stats()
        full = STORE.report()
        if full is not None:
            stats.metadata = {**(stats.metadata or {}), "store_full": full}
        if self.report is not None:  # the service's own facts (recovery: its sleeping runs, the next wake)
            stats.metadata = {**(stats.metadata or {}), **self.report()}
        stats.endpoints = [*stats.endpoints, *(
            EndpointStats(name=endpoint_name(s), subject=s, queue_group=self.durable, num_requests=c.num_requests,
                          num_errors=c.num_errors, processing_time=c.processing_time_ns,
                          average_processing_time=c.processing_time_ns // max(1, c.num_requests),
                          last_error=c.last_error or None)
            for s, c in self.counters.by_subject.items())]
        return stats


async def register(nc: Client, *, service: str, namespace: str, counters: Counters, durable: str, stream: str,
                   instance_id: str | None = None, report: Callable[[], dict[str, str]] | None = None,
                   ) -> ReelService | None:
    """Register ``reel-<service>`` on ``nc`` and start answering ``$SRV.*``; ``None`` (logged) if it cannot.

    ``report``: more STATS metadata, asked at each STATS request (string values).

    Discovery is an operator's aid: a server that refuses the ``$SRV`` subscriptions (a role
    without them, docs/security.md) costs a ``micro.unavailable`` warning, never the service.
    """
    meta = {"namespace": namespace, "stream": stream, "durable": durable, "subjects": ",".join(counters.subjects),
            "host": socket.gethostname(), "pid": str(os.getpid())}
    config = ServiceConfig(name=f"{SERVICE_PREFIX}{service}", version=version(),
                           description=f"Reel {service} (commands through JetStream consumer {durable})",
                           metadata=meta)
    svc = ReelService(nc, config, counters, durable=durable, stream=stream, instance_id=instance_id, report=report)
    try:
        await svc.start()
    except Exception as exc:
        log.warning("micro.unavailable", service=config.name, error=str(exc)[:200])
        return None
    log.info("micro.registered", service=config.name, instance_id=svc.id)
    return svc


async def unregister(svc: ReelService | None) -> None:
    """Stop answering ``$SRV.*`` (best effort: the connection may be closing)."""
    if svc is not None:
        with contextlib.suppress(Exception):
            await svc.stop()


async def discover(nc: Client, verb: str, *, namespace: str | None = None, name: str | None = None,
                   timeout_s: float = 0.5, expected: int | None = None) -> list[dict[str, object]]:
    """Ask every micro service ``$SRV.<verb>`` (``PING``, ``INFO``, ``STATS``; ``.<name>`` with ``name``)
    and collect the answers of Reel's services (names ``reel-…``) of ``namespace`` (any without).

    Scatter-gather: it waits ``timeout_s`` seconds for answers, or until ``expected`` matching
    ones have arrived. Answers that are not JSON objects are skipped. Returns the decoded
    answers (micro's ``io.nats.micro.v1.<verb>_response`` schema), sorted by (name, id).
    """
    inbox = nc.new_inbox()
    got: list[dict[str, object]] = []
    enough = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        try:
            body = json.loads(msg.data)
        except ValueError:
            return
        if not isinstance(body, dict) or not str(body.get("name", "")).startswith(SERVICE_PREFIX):
            return
        meta = body.get("metadata") or {}
        if namespace is not None and (not isinstance(meta, dict) or meta.get("namespace") != namespace):
            return
        got.append(body)
        if expected is not None and len(got) >= expected:
            enough.set()

    sub = await nc.subscribe(inbox, cb=on_msg)
    try:
        await nc.publish(f"$SRV.{verb.upper()}" + (f".{name}" if name else ""), b"", reply=inbox)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await enough.wait()
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return sorted(got, key=lambda b: (str(b.get("name")), str(b.get("id"))))
