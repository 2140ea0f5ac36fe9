"""Crucible service: a worker that runs and resumes sessions on command.

Commands (JSON, on Reel's commands stream, so none is lost while no worker runs):

* ``<ns>.cmd.crucible.run``    — :class:`RunSession` ``{config, session_id?}``; ``config`` is a
  resolved :class:`~reel.shared.crucible.config.SessionConfig` (absolute paths: ``reel crucible run``
  resolves files, a service has no config directory to be relative to).
* ``<ns>.cmd.crucible.resume`` — :class:`ResumeSession` ``{session_id}``.

The worker acknowledges at once on the command's ``Reel-Reply-To`` inbox (``Reply``
with ``run_id`` = the session id) and then drives the session to its end; the
command message stays un-acked (kept alive with in-progress acks) until then, so
if the worker dies JetStream redelivers it — a redelivered ``run`` of a session that
exists already is turned into a ``resume`` — and another worker continues from the
log. SIGTERM stops every session at its next gate (``LoopExit.STOPPED``, resumable).
Several workers share one durable consumer (``<ns>_crucible``); one session is
only ever driven by one of them (world lock + the log's expected-sequence fence).
"""

from __future__ import annotations

import asyncio
import hashlib

import msgspec
import structlog

from reel.services.crucible.session import Backend, resume_session, start_session
from reel.services.crucible.sessionlog import SessionLog, ensure_session_stream
from reel.shared.core.errors import ReelError
from reel.shared.core.run.ids import RunId
from reel.shared.core.wire.commands import Reply
from reel.shared.crucible.config import SessionConfig, validate
from reel.shared.crucible.errors import ConfigInvalid, SessionExists
from reel.shared.crucible.names import CrucibleNames
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.consumer import Ack, CommandConsumer, Delivery, Router, Then
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config

log = structlog.get_logger("reel.crucible")


class RunSession(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start a session (``<ns>.cmd.crucible.run``). ``session_id`` makes a repeated command harmless."""

    config: SessionConfig
    session_id: str | None = None


class ResumeSession(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Continue a session from its log (``<ns>.cmd.crucible.resume``)."""

    session_id: str


def session_id_for(cmd: Delivery) -> str:
    """The session id of a ``run`` without one: derived from the message, so a redelivery maps to it again."""
    return "cs-" + hashlib.sha256(cmd.identity.encode()).hexdigest()[:12]


class Worker:
    """Handles crucible commands for one service instance."""

    def __init__(self, infra: Infra, cfg: Config, stop: asyncio.Event) -> None:
        self.infra, self.cfg, self.stop = infra, cfg, stop
        self.backend = Backend(nc=infra.nc, cfg=cfg, log=SessionLog(infra.nc, cfg, writer="crucible-service"),
                               blobs=JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket,
                                                                        purge=not cfg.auth.configured))

    async def run(self, start: RunSession, cmd: Delivery) -> Then:
        """Reply, then start the session (or resume it: a redelivered ``run``) and drive it to its end."""
        sid = start.session_id or session_id_for(cmd)
        validate(start.config)
        resume = await self.backend.log.exists(sid)
        return self._drive(sid, start.config if not resume else None)

    async def resume(self, req: ResumeSession, _: Delivery) -> Then:
        """Reply, then resume the session and drive it to its end."""
        await self.backend.log.load(req.session_id)  # SessionNotFound before anything else
        return self._drive(req.session_id, None)

    def _drive(self, sid: str, config: SessionConfig | None) -> Then:
        async def work() -> Ack:
            try:
                if config is None:
                    exit_ = (await resume_session(self.backend, sid, stop=self.stop)).exit
                else:
                    exit_ = (await start_session(self.backend, config, stop=self.stop, session_id=sid)).exit
            except SessionExists:
                exit_ = (await resume_session(self.backend, sid, stop=self.stop)).exit
            except (ConfigInvalid, ReelError) as exc:
                log.warning("crucible.command_failed", session_id=sid, code=exc.code, reason=exc.message)
                return Ack.NAK if exc.retryable else Ack.ACK
            log.info("crucible.session_done", session_id=sid, exit=exit_.value, exit_code=exit_.exit_code)
            return Ack.ACK

        return Then(Reply(ok=True, run_id=RunId(sid), status="starting" if config is not None else "resuming"), work)


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event) -> None:
    """Run one Crucible worker until ``stop`` is set (creates the session-log stream idempotently)."""
    await ensure_session_stream(infra.js, cfg)
    names = CrucibleNames(cfg.names)
    worker = Worker(infra, cfg, stop)
    router = Router(infra)
    router.route(names.command("run"), RunSession, worker.run, bind={"command": "run"})
    router.route(names.command("resume"), ResumeSession, worker.resume, bind={"command": "resume"})
    consumer = CommandConsumer(infra, cfg, names.consumer_service, router.subjects, router,
                               concurrency=cfg.max_concurrent_runs)
    await consumer.run(stop)
