"""The thin async shell every consuming service shares.

A service is a durable pull consumer on the commands stream (the verifier: the
events stream), filtered to its own subjects. Several instances of a service share
one durable consumer, so work spreads across them. A handler gets the
:class:`Delivery` and returns an :class:`Ack` decision; only this shell touches the
JetStream message (ack, nak, term, in-progress heartbeats while long work runs).

Command services do not write that handler: a :class:`Router` is one. Per command
subject it decodes the body into the command struct, checks its run id, binds the
log context, calls the service's handler (which returns the :class:`Reply`, or
:class:`Then`: a reply now and more work before the ack), turns a refusal
(:class:`~reel.shared.core.errors.ReelError`) into an error reply with a
``<service>.rejected`` log line, answers on ``Reel-Reply-To`` and acks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api as jsapi
from nats.js.errors import FetchTimeoutError

from reel.shared.core.errors import InvalidCommand, ReelError
from reel.shared.core.wire.commands import Reply, decode_command, encode, error_reply
from reel.shared.core.wire.subjects import MSG_ID_HEADER, REPLY_TO_HEADER, is_token
from reel.shared.nats.infra import Infra
from reel.shared.nats.micro import Counters, begin_delivery, note_refusal, register, unregister
from reel.shared.nats.publish import StoreFull
from reel.shared.runtime import metrics
from reel.shared.runtime.config import Config

log = structlog.get_logger(__name__)


FETCH_TIMEOUT_S = 0.5
FETCH_BATCH = 64
"""At most this many messages per fetch (never more than the free slots): what is queued comes at once, so a
burst of a thousand starts is taken in a few round trips, not a thousand."""


class Ack(enum.Enum):
    """What to do with a command message once its handler returns."""

    ACK = "ack"  # done (including: refused with an error reply)
    NAK = "nak"  # transient failure: redeliver after a delay
    TERM = "term"  # never redeliver


@dataclass(frozen=True)
class Delivery:
    """One delivered message (a command, or a run commit for the verifier): body, subject,
    the client's reply subject, delivery count."""

    subject: str
    data: bytes
    reply_to: str | None
    stream_seq: int
    stored_ns: int  # when the stream stored it (Unix ns): with stream_seq, unique even across stream re-creation
    num_delivered: int
    msg_id: str | None

    @property
    def identity(self) -> str:
        """What identifies this message across redeliveries and stream re-creation:
        its ``Nats-Msg-Id`` if the client sent one, else ``<stream seq>@<stored ns>``."""
        return self.msg_id or f"{self.stream_seq}@{self.stored_ns}"


Handler = Callable[[Delivery], Awaitable[Ack]]
_C = TypeVar("_C")


def reply_subject_ok(subject: str) -> bool:
    """True if ``subject`` may receive a service's reply: a literal subject under an inbox
    (first token ``_INBOX`` or ``_INBOX_<role>``). Anything else — a run's event subject, a KV or
    object-store subject — would let a client make a service write there (docs/security.md)."""
    tokens = subject.split(".")
    return (len(tokens) >= 2 and tokens[0].startswith("_INBOX") and all(tokens)
            and not any(t in ("*", ">") or any(c.isspace() for c in t) for t in tokens))


async def send_reply(infra: Infra, cmd: Delivery, reply: Reply) -> None:
    """Answer a command on its ``Reel-Reply-To`` subject (no-op when it has none; refused, with a
    ``command.reply_refused`` warning, unless :func:`reply_subject_ok`)."""
    if not cmd.reply_to:
        return
    if not reply_subject_ok(cmd.reply_to):
        log.warning("command.reply_refused", reply_to=cmd.reply_to[:200], subject=cmd.subject,
                    stream_seq=cmd.stream_seq)
        return
    await infra.nc.publish(cmd.reply_to, encode(reply))


@dataclass(frozen=True)
class Then:
    """A handler's answer that needs more work: send ``reply`` now, then keep the message
    un-acked (in-progress acks) while ``work()`` runs; its :class:`Ack` decides. An error
    raised by ``work`` is not a reply (one was sent): it is logged and the message nak'ed."""

    reply: Reply
    work: Callable[[], Awaitable[Ack]]


class Deferred(Exception):
    """Raised by a handler that leaves the command to another instance: no reply, the message is nak'ed
    (redelivered after the consumer's backoff, to any instance of the durable)."""


def _invalid_run_id(run_id: str) -> str:
    return f"run_id {run_id!r} is not a valid run id"


def _run_id_of(cmd: object) -> str | None:
    run_id = getattr(cmd, "run_id", None)
    return run_id if isinstance(run_id, str) else None


def _check_session_id(cmd: object) -> None:
    """A crucible session id names one subject token too (``*`` or ``a.>`` would read other sessions' logs)."""
    session_id = getattr(cmd, "session_id", None)
    if isinstance(session_id, str) and not is_token(session_id):
        raise InvalidCommand(f"session_id {session_id[:80]!r} is not a valid session id (at `$.session_id`)")


class Router:
    """A :data:`Handler` that routes each command subject to its typed handler (see module doc).

    Args:
        infra: the connection replies go out on.
        route_of: maps a delivered subject to the routed one (e.g. a partitioned keyed command to its
            plain subject); the handler still sees the delivered subject.
    """

    def __init__(self, infra: Infra, route_of: Callable[[str], str] | None = None) -> None:
        self.infra, self.route_of = infra, route_of
        self._routes: dict[str, Handler] = {}

    @property
    def subjects(self) -> list[str]:
        """The routed subjects, in the order routed (the consumer's filter)."""
        return list(self._routes)

    def route(self, subject: str, kind: type[_C], handler: Callable[[_C, Delivery], Awaitable[Reply | Then]], *,
              rejected: str | None = None, rejected_fields: Mapping[str, Any] | None = None,
              bind: Mapping[str, Any] | None = None,
              invalid_run_id: Callable[[str], str] = _invalid_run_id) -> None:
        """Send commands on ``subject`` (decoded as ``kind``) to ``handler(command, delivery)``.

        Args:
            rejected: the warning logged for a refused command (``code``, ``reason``,
                ``stream_seq``, after ``rejected_fields``); ``None``: no line, except for a body that
                does not decode (too big, nested too deep, not JSON, wrong schema): ``command.undecodable``.
            bind: log context bound for the whole command (before decoding).
            invalid_run_id: the refusal's message for a ``run_id`` that is not one subject token.

        The command's ``run_id`` (if it has a non-null one) must be one token
        (:func:`~reel.shared.core.wire.subjects.is_token`, else ``InvalidCommand``); it is then bound in the log
        context.
        So must a ``session_id`` (crucible's commands).
        """
        extra = dict(rejected_fields or {})
        context = dict(bind or {})

        async def handle(delivery: Delivery) -> Ack:
            structlog.contextvars.bind_contextvars(**context)
            cmd: _C | None = None
            try:
                cmd = decode_command(delivery.data, kind)
                run_id = _run_id_of(cmd)
                if run_id is not None:
                    if not is_token(run_id):
                        raise InvalidCommand(invalid_run_id(run_id))
                    structlog.contextvars.bind_contextvars(run_id=run_id)
                _check_session_id(cmd)
                answer = await handler(cmd, delivery)
            except Deferred as exc:
                log.info("command.deferred", **extra, reason=str(exc), stream_seq=delivery.stream_seq,
                         delivered=delivery.num_delivered)
                return Ack.NAK
            except ReelError as exc:
                note_refusal(exc.code, exc.message)
                line = rejected if rejected is not None else "command.undecodable" if cmd is None else None
                if line is not None:
                    log.warning(line, **extra, code=exc.code, reason=exc.message, stream_seq=delivery.stream_seq)
                answer = error_reply(exc)
            await send_reply(self.infra, delivery, answer.reply if isinstance(answer, Then) else answer)
            return await answer.work() if isinstance(answer, Then) else Ack.ACK

        self._routes[subject] = handle

    async def __call__(self, delivery: Delivery) -> Ack:
        """Handle one delivery by its subject's route (an unrouted subject is logged and acked)."""
        handle = self._routes.get(self.route_of(delivery.subject) if self.route_of else delivery.subject)
        if handle is None:
            log.error("command.unrouted", subject=delivery.subject, stream_seq=delivery.stream_seq)
            return Ack.ACK
        return await handle(delivery)


class _KeepAlive:
    """Sends ``msg.in_progress()`` every ``every_s`` seconds from a loop timer until :meth:`cancel`."""

    def __init__(self, msg: Msg, every_s: float) -> None:
        self._msg, self._every_s, self._loop = msg, every_s, asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle = self._loop.call_later(every_s, self._fire)
        self._sending: asyncio.Task[None] | None = None

    def _fire(self) -> None:
        self._sending = self._loop.create_task(self._send())
        self._timer = self._loop.call_later(self._every_s, self._fire)

    async def _send(self) -> None:
        with contextlib.suppress(Exception):
            await self._msg.in_progress()

    def cancel(self) -> None:
        self._timer.cancel()
        if self._sending is not None:
            self._sending.cancel()


class Slots:
    """A limit on the commands handled at once, shared by the consumers of one process (an executor's shared
    durable and its partitions' durables draw on one :class:`Slots`).

    A consumer takes the slots of a fetch before it and gives back those no message came for, so the commands
    handled never pass ``limit``. Slots freed while consumers wait go to them first come, first served (a
    consumer whose durable is empty cannot starve one whose durable has work).
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a concurrency limit must be at least 1, got {limit}")
        self.limit, self.taken = limit, 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def free(self) -> int:
        """Slots free now (≤ 0: none)."""
        return self.limit - self.taken

    def take_now(self, most: int) -> int:
        """Take up to ``most`` free slots at once (0 if none is free or consumers wait for one): how many."""
        n = 0 if self._waiters else max(0, min(most, self.free()))
        self.taken += n
        return n

    async def take(self, most: int) -> int:
        """Take between 1 and ``most`` slots, waiting in turn for the first: how many."""
        got = self.take_now(most)
        if got:
            return got
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # resolved by give() with one slot taken for us
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give(1)  # handed one we will not use
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise
        more = max(0, min(most - 1, self.free()))
        self.taken += more
        return 1 + more

    def give(self, n: int = 1) -> None:
        """Give back ``n`` slots (to the consumers waiting first)."""
        self.taken -= n
        while self._waiters and self.free() > 0:
            fut = self._waiters.popleft()
            if not fut.done():
                self.taken += 1
                fut.set_result(None)


class CommandConsumer:
    """Consume ``subjects`` of a stream (default: the commands stream) with a shared durable consumer.

    Args:
        stream: the stream to consume (e.g. the events stream for the verifier).
        service: durable name suffix (``<ns>_<service>``).
        concurrency: commands handled at once by this instance.
        slots: the limit shared with the process's other consumers (:class:`Slots`); ``None``: one of its
            own of ``concurrency``.
        ack_wait_s: redelivery delay if this instance dies mid-command; long handlers
            are kept alive with in-progress acks every ``ack_wait_s / 3``.
        instance_id: this instance's id (an executor's ``x-…``): its NATS micro instance id.
        report: more ``$SRV.STATS`` metadata, asked at each request (recovery: its sleeping runs).

    While it runs it is the NATS micro service ``reel-<service>`` (:mod:`reel.shared.nats.micro`):
    ``counters`` holds what ``$SRV.STATS`` reports per subject. Each delivery's log context
    starts from the one ``run`` was called in (an executor's ``executor_id``, …), plus ``service``.
    """

    def __init__(self, infra: Infra, cfg: Config, service: str, subjects: list[str], handler: Handler, *,
                 concurrency: int = 8, ack_wait_s: float = 30.0, max_deliver: int = 20,
                 stream: str | None = None, instance_id: str | None = None, slots: Slots | None = None,
                 report: Callable[[], dict[str, str]] | None = None) -> None:
        self.infra, self.cfg, self.service, self.instance_id, self.report = infra, cfg, service, instance_id, report
        self.slots = slots if slots is not None else Slots(concurrency)
        self.stream = stream or cfg.names.commands_stream
        self.subjects, self.handler = subjects, handler
        self.concurrency, self.ack_wait_s, self.max_deliver = concurrency, ack_wait_s, max_deliver
        self._tasks: set[asyncio.Task[None]] = set()
        self.counters = Counters(list(subjects))
        self._context: dict[str, Any] = {}

    async def _subscribe(self) -> object:
        durable = self.cfg.names.consumer(self.service)
        config = jsapi.ConsumerConfig(
            durable_name=durable, ack_policy=jsapi.AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s,
            max_deliver=self.max_deliver, filter_subjects=self.subjects, max_ack_pending=-1,
        )
        try:
            await self.infra.js.add_consumer(self.stream, config)
        except Exception as exc:  # exists with a config the server will not update in place
            log.warning("consumer.config_kept", durable=durable, error=str(exc))
        return await self.infra.js.pull_subscribe_bind(durable, stream=self.stream)

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and handle commands until ``stop`` is set, then drain in-flight work.

        Fetches what is queued, up to the free handler slots (``concurrency``, or the shared ``slots``) and
        :data:`FETCH_BATCH`, while a slot is free.
        A fetch is never abandoned half-way: a cancelled fetch leaves its pull
        request on the server, which would strand the next command until its ack
        wait expires (nats.py#986); a message that arrives while stopping is nak'ed
        so another instance gets it at once.
        """
        psub = await self._subscribe()
        durable = self.cfg.names.consumer(self.service)
        log.info("service.consuming", subjects=self.subjects, durable=durable)
        self._context = structlog.contextvars.get_contextvars()
        micro = await register(self.infra.nc, service=self.service, namespace=self.cfg.names.namespace,
                               counters=self.counters, durable=durable, stream=self.stream,
                               instance_id=self.instance_id, report=self.report)
        stopper = asyncio.create_task(stop.wait())
        depth = asyncio.create_task(self._poll_depth(durable)) if metrics.enabled() else None
        try:
            while not stop.is_set():
                want = self.slots.take_now(FETCH_BATCH)  # reserved for the messages this fetch may bring
                if not want:
                    taking = asyncio.ensure_future(self.slots.take(FETCH_BATCH))
                    await asyncio.wait({taking, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if not taking.done():
                        taking.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await taking
                        continue
                    want = taking.result()
                    if stop.is_set():
                        self.slots.give(want)
                        break
                try:
                    msgs = await psub.fetch(want, timeout=FETCH_TIMEOUT_S)  # type: ignore[attr-defined]
                except (FetchTimeoutError, NatsTimeoutError, TimeoutError):
                    self.slots.give(want)
                    continue
                except Exception as exc:  # connection trouble: back off, the client reconnects
                    self.slots.give(want)
                    log.warning("service.fetch_failed", error=str(exc))
                    await asyncio.sleep(0.5)
                    continue
                if stop.is_set():  # arrived while stopping: hand them straight back for another instance
                    self.slots.give(want)
                    for m in msgs:
                        with contextlib.suppress(Exception):
                            await m.nak()
                    break
                self.slots.give(want - len(msgs))
                for m in msgs:
                    task = asyncio.create_task(self._handle(m))
                    self._tasks.add(task)
                    task.add_done_callback(self._done)
        except asyncio.CancelledError:  # cancelled (not stopped): cancel the handlers too, don't drain them
            for task in self._tasks:
                task.cancel()
            raise
        finally:
            stopper.cancel()
            if depth is not None:
                depth.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            await unregister(micro)
            with contextlib.suppress(Exception):
                await psub.unsubscribe()  # type: ignore[attr-defined]

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.slots.give()

    async def _poll_depth(self, durable: str) -> None:
        """Keep the queue-depth gauges of this durable fresh while idle (shared/runtime/metrics.py)."""
        while True:
            with contextlib.suppress(Exception):
                info = await self.infra.js.consumer_info(self.stream, durable)
                metrics.set_consumer_depth(durable, info.num_pending, info.num_ack_pending)
            await asyncio.sleep(metrics.DEPTH_POLL_S)

    async def _handle(self, msg: Msg) -> None:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(**{**self._context, "service": self.service})
        started_ns, outcome = time.perf_counter_ns(), begin_delivery()
        meta = msg.metadata
        metrics.set_consumer_depth(self.cfg.names.consumer(self.service), meta.num_pending)
        headers = msg.headers or {}
        cmd = Delivery(subject=msg.subject, data=msg.data, reply_to=headers.get(REPLY_TO_HEADER),
                      stream_seq=meta.sequence.stream, num_delivered=meta.num_delivered,
                      stored_ns=int(meta.timestamp.timestamp() * 1e9) if meta.timestamp else 0,
                      msg_id=headers.get(MSG_ID_HEADER))
        keepalive = _KeepAlive(msg, self.ack_wait_s / 3)  # a timer, no task per delivery
        try:
            decision = await self.handler(cmd)
        except StoreFull as exc:  # not a bug: the store stayed full past a write's retries; redelivered later
            log.warning("command.store_full", subject=cmd.subject, stream_seq=cmd.stream_seq, reason=exc.message)
            decision, outcome.error = Ack.NAK, "store_full"
        except Exception as exc:
            log.exception("command.handler_crashed", subject=cmd.subject, stream_seq=cmd.stream_seq)
            decision, outcome.error = Ack.NAK, f"crashed: {exc.__class__.__name__}"
        finally:
            keepalive.cancel()
        if outcome.error is None and decision is not Ack.ACK:
            outcome.error = decision.value
        self.counters.record(cmd.subject, time.perf_counter_ns() - started_ns, outcome.error)
        try:
            if decision is Ack.ACK:
                await msg.ack()
            elif decision is Ack.NAK:
                await msg.nak(delay=min(30.0, 0.5 * cmd.num_delivered))
            else:
                await msg.term()
        except Exception as exc:
            log.warning("command.ack_failed", decision=decision.value, error=str(exc))
