"""Verifier service: a durable consumer on the verification triggers, shared by every instance.

A run that commits ``run_verifying`` at LSN P gets one trigger, a ``VerifyRun`` on
``<ns>.cmd.verify.<run_id>`` (commands stream, work queue, ``Nats-Msg-Id``
``verify:<run>:<P>``): the executor publishes it right after the commit, and recovery's
sweep publishes it again for a run resting in Verifying with no trigger queued (the
executor died between the two). So a verifier receives O(1) messages per run, whatever
the run's length — never the run's other commits. Each trigger is delivered to exactly
one instance, which runs the verification job (services/verifier/handler.py) and acks
only when it is done, so an instance that dies mid-job has its trigger redelivered
(after ``ack_wait_s``) to another one, which resumes from the verdicts already recorded
in the run's log. A trigger naming no ``run_verifying`` commit of its run (a forged one)
is logged and terminated; a run found corrupt (:mod:`reel.shared.core.run.integrity`) gets an
``error`` verdict from each verifier not yet recorded (published, not recorded) and its
trigger is terminated.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog

from reel.shared.core.errors import InvalidCommand, InvalidTransition, ReelError, RunNotFound, UnknownEventType
from reel.shared.core.ports import BlobStore, EventLog
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.wire.commands import VerifyRun, decode_command
from reel.shared.core.wire.subjects import is_token
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.consumer import Ack, CommandConsumer, Delivery
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config

from .handler import NotATrigger, SnapshotNotVisible, VerificationHandler

log = structlog.get_logger("reel.verifier")


def new_verifier_id() -> str:
    """A fresh id for one verifier instance (the ``writer`` of its commits)."""
    return "v-" + uuid.uuid4().hex[:12]


class VerifierService:
    """One verifier instance: decode a delivered trigger, run its verification job."""

    def __init__(self, infra: Infra, cfg: Config, events: EventLog, blobs: BlobStore, *,
                 instance_id: str | None = None) -> None:
        self.instance_id = instance_id or new_verifier_id()
        self.handler = VerificationHandler(infra.nc, cfg.names, events, blobs, writer=self.instance_id)

    async def handle(self, cmd: Delivery) -> Ack:
        """Handle one verification trigger (a ``VerifyRun``; an undecodable one is logged and dropped)."""
        try:
            trigger = decode_command(cmd.data, VerifyRun)
            if not is_token(trigger.run_id):
                raise InvalidCommand(f"run_id {trigger.run_id[:80]!r} is not a valid run id")
        except InvalidCommand as exc:
            log.error("verification.trigger_undecodable", subject=cmd.subject, stream_seq=cmd.stream_seq,
                      error=exc.message)
            return Ack.TERM
        structlog.contextvars.bind_contextvars(run_id=trigger.run_id, snapshot_lsn=trigger.snapshot_lsn,
                                               branch_id=trigger.branch_id, verifier_id=self.instance_id)
        try:
            job = await self.handler.open_job(trigger.run_id, trigger.snapshot_lsn, trigger.branch_id)
        except SnapshotNotVisible as exc:
            log.warning("verification.snapshot_not_visible", reason=exc.message)
            return Ack.NAK
        except RunCorrupt as exc:
            await self.handler.corrupt(trigger.run_id, trigger.snapshot_lsn, trigger.branch_id, exc)
            return Ack.TERM
        except (RunNotFound, InvalidTransition, UnknownEventType, NotATrigger) as exc:
            log.error("verification.unreadable_run", code=exc.code, reason=exc.message)
            return Ack.TERM
        started = log.info if cmd.num_delivered > 1 else log.debug  # INFO per run: its verdicts and completion
        started("verification.started", redelivery=cmd.num_delivered > 1, verifiers=len(job.pinned.verifiers),
                already_recorded=len(job.recorded()), failed_attempts=job.view.failed_attempts)
        try:
            await self.handler.run(job)
        except RunCorrupt as exc:  # it went corrupt during the job
            await self.handler.corrupt(trigger.run_id, trigger.snapshot_lsn, trigger.branch_id, exc)
            return Ack.TERM
        except ReelError as exc:
            log.warning("verification.retry", code=exc.code, reason=exc.message)
            return Ack.NAK
        return Ack.ACK


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, *, ack_wait_s: float | None = None,
                concurrency: int | None = None, instance_id: str | None = None) -> None:
    """Run one verifier instance until ``stop`` is set (in-flight jobs are drained).

    Args:
        ack_wait_s: redelivery delay of a job whose instance died (default
            ``cfg.command_ack_wait_s``); long jobs are kept alive with in-progress acks.
        concurrency: jobs handled at once by this instance.
        instance_id: this instance's id (the ``writer`` of its commits).
    """
    service = VerifierService(infra, cfg, JetStreamEventLog(infra.nc, cfg.names),
                              JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket), instance_id=instance_id)
    structlog.contextvars.bind_contextvars(verifier_id=service.instance_id)
    durable = cfg.names.consumer("verifier")
    with contextlib.suppress(Exception):  # the firehose durable of earlier versions (on the events stream)
        await infra.js.delete_consumer(cfg.names.events_stream, durable)
    consumer = CommandConsumer(
        infra, cfg, "verifier", [cfg.names.verify_all], service.handle,
        concurrency=concurrency or cfg.max_concurrent_runs,
        ack_wait_s=ack_wait_s if ack_wait_s is not None else cfg.command_ack_wait_s,
        instance_id=service.instance_id,
    )
    await consumer.run(stop)
