"""The thin async shell every command-consuming service shares (brief §6).

A service is a durable pull consumer on the commands stream, filtered to its own
command subjects. Several instances of a service share one durable consumer, so
work spreads across them. A handler gets the message body and returns an
:class:`Ack` decision; only this shell touches the JetStream message (ack, nak,
term, in-progress heartbeats while long work runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api as jsapi
from nats.js.errors import FetchTimeoutError

from shared.config import Config
from shared.core.commands import Reply, encode
from shared.core.subjects import MSG_ID_HEADER, REPLY_TO_HEADER
from shared.nats.infra import Infra

log = structlog.get_logger(__name__)


FETCH_TIMEOUT_S = 0.5


class Ack(enum.Enum):
    """What to do with a command message once its handler returns."""

    ACK = "ack"  # done (including: refused with an error reply)
    NAK = "nak"  # transient failure: redeliver after a delay
    TERM = "term"  # never redeliver


@dataclass(frozen=True)
class Command:
    """One delivered command: body, subject, the client's reply subject, delivery count."""

    subject: str
    data: bytes
    reply_to: str | None
    stream_seq: int
    stored_ns: int  # when the stream stored it (Unix ns): with stream_seq, unique even across stream re-creation
    num_delivered: int
    msg_id: str | None

    @property
    def identity(self) -> str:
        """What identifies this command message across redeliveries and stream re-creation:
        its ``Nats-Msg-Id`` if the client sent one, else ``<stream seq>@<stored ns>``."""
        return self.msg_id or f"{self.stream_seq}@{self.stored_ns}"


Handler = Callable[[Command], Awaitable[Ack]]


async def send_reply(infra: Infra, cmd: Command, reply: Reply) -> None:
    """Answer a command on its ``Reel-Reply-To`` subject (no-op when it has none)."""
    if cmd.reply_to:
        await infra.nc.publish(cmd.reply_to, encode(reply))


class CommandConsumer:
    """Consume ``subjects`` of a stream (default: the commands stream) with a shared durable consumer.

    Args:
        stream: the stream to consume (e.g. the events stream for the verifier).
        service: durable name suffix (``<ns>_<service>``).
        concurrency: commands handled at once by this instance.
        ack_wait_s: redelivery delay if this instance dies mid-command; long handlers
            are kept alive with in-progress acks every ``ack_wait_s / 3``.
    """

    def __init__(self, infra: Infra, cfg: Config, service: str, subjects: list[str], handler: Handler, *,
                 concurrency: int = 8, ack_wait_s: float = 30.0, max_deliver: int = 20,
                 stream: str | None = None) -> None:
        self.infra, self.cfg, self.service = infra, cfg, service
        self.stream = stream or cfg.names.commands_stream
        self.subjects, self.handler = subjects, handler
        self.concurrency, self.ack_wait_s, self.max_deliver = concurrency, ack_wait_s, max_deliver
        self._tasks: set[asyncio.Task[None]] = set()

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

        Fetches one message at a time while a handler slot is free (``concurrency``).
        A fetch is never abandoned half-way: a cancelled fetch leaves its pull
        request on the server, which would strand the next command until its ack
        wait expires (nats.py#986); a message that arrives while stopping is nak'ed
        so another instance gets it at once.
        """
        psub = await self._subscribe()
        log.info("service.consuming", subjects=self.subjects, durable=self.cfg.names.consumer(self.service))
        stopper = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                free = self.concurrency - len(self._tasks)
                if free <= 0:
                    await asyncio.wait({*self._tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    continue
                try:
                    msgs = await psub.fetch(1, timeout=FETCH_TIMEOUT_S)  # type: ignore[attr-defined]
                except (FetchTimeoutError, NatsTimeoutError, TimeoutError):
                    continue
                except Exception as exc:  # connection trouble: back off, the client reconnects
                    log.warning("service.fetch_failed", error=str(exc))
                    await asyncio.sleep(0.5)
                    continue
                if stop.is_set():  # arrived while stopping: hand it straight back for another instance
                    for m in msgs:
                        with contextlib.suppress(Exception):
                            await m.nak()
                    break
                for m in msgs:
                    task = asyncio.create_task(self._handle(m))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except asyncio.CancelledError:  # cancelled (not stopped): cancel the handlers too, don't drain them
            for task in self._tasks:
                task.cancel()
            raise
        finally:
            stopper.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await psub.unsubscribe()  # type: ignore[attr-defined]

    async def _keepalive(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(self.ack_wait_s / 3)
            with contextlib.suppress(Exception):
                await msg.in_progress()

    async def _handle(self, msg: Msg) -> None:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(service=self.service)
        meta = msg.metadata
        headers = msg.headers or {}
        cmd = Command(subject=msg.subject, data=msg.data, reply_to=headers.get(REPLY_TO_HEADER),
                      stream_seq=meta.sequence.stream, num_delivered=meta.num_delivered,
                      stored_ns=int(meta.timestamp.timestamp() * 1e9) if meta.timestamp else 0,
                      msg_id=headers.get(MSG_ID_HEADER))
        keepalive = asyncio.create_task(self._keepalive(msg))
        try:
            decision = await self.handler(cmd)
        except Exception:
            log.exception("command.handler_crashed", subject=cmd.subject, stream_seq=cmd.stream_seq)
            decision = Ack.NAK
        finally:
            keepalive.cancel()
        try:
            if decision is Ack.ACK:
                await msg.ack()
            elif decision is Ack.NAK:
                await msg.nak(delay=min(30.0, 0.5 * cmd.num_delivered))
            else:
                await msg.term()
        except Exception as exc:
            log.warning("command.ack_failed", decision=decision.value, error=str(exc))
