"""Verifier service: a durable consumer on the run-events stream shared by every instance.

Each commit of every run is delivered to exactly one instance; commits without a
``run_verifying`` event are acked at once. For a ``run_verifying`` commit at LSN P
the instance runs the verification job (services/verifier/handler.py) and acks
only when it is done, so an instance that dies mid-job has its message redelivered
(after ``ack_wait_s``) to another one, which resumes from the verdicts already
recorded in the run's log.
"""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import structlog

from shared.config import Config
from shared.core.errors import InvalidTransition, ReelError, RunNotFound, UnknownEventType
from shared.core.events import decode_commit
from shared.core.ports import BlobStore, EventLog
from shared.nats.blobstore import JetStreamBlobStore
from shared.nats.consumer import Ack, CommandConsumer, Delivery
from shared.nats.eventlog import JetStreamEventLog
from shared.nats.infra import Infra

from .handler import SnapshotNotVisible, VerificationHandler, verifying_event

log = structlog.get_logger("reel.verifier")


def new_verifier_id() -> str:
    """A fresh id for one verifier instance (the ``writer`` of its commits)."""
    return "v-" + uuid.uuid4().hex[:12]


class VerifierService:
    """One verifier instance: decode a delivered commit, run its verification job if it has one."""

    def __init__(self, infra: Infra, cfg: Config, events: EventLog, blobs: BlobStore, *,
                 instance_id: str | None = None) -> None:
        self.instance_id = instance_id or new_verifier_id()
        self.handler = VerificationHandler(infra.nc, cfg.names, events, blobs, writer=self.instance_id)

    async def handle(self, cmd: Delivery) -> Ack:
        """Handle one run-events message (``cmd.stream_seq`` is its LSN)."""
        try:
            commit = decode_commit(cmd.data)
        except (UnknownEventType, msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.error("commit.undecodable", subject=cmd.subject, lsn=cmd.stream_seq, error=str(exc))
            return Ack.TERM
        event = verifying_event(commit)
        if event is None:
            return Ack.ACK
        structlog.contextvars.bind_contextvars(run_id=commit.run_id, snapshot_lsn=cmd.stream_seq,
                                               branch_id=event.branch_id, verifier_id=self.instance_id)
        try:
            job = await self.handler.open_job(commit.run_id, cmd.stream_seq, event.branch_id)
        except SnapshotNotVisible as exc:
            log.warning("verification.snapshot_not_visible", reason=exc.message)
            return Ack.NAK
        except (RunNotFound, InvalidTransition, UnknownEventType) as exc:
            log.error("verification.unreadable_run", code=exc.code, reason=exc.message)
            return Ack.TERM
        log.info("verification.started", redelivery=cmd.num_delivered > 1, verifiers=len(job.pinned.verifiers),
                 already_recorded=len(job.recorded()), failed_attempts=job.view.failed_attempts)
        try:
            await self.handler.run(job)
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
        concurrency: jobs (and commits) handled at once by this instance.
        instance_id: this instance's id (the ``writer`` of its commits).
    """
    service = VerifierService(infra, cfg, JetStreamEventLog(infra.nc, cfg.names),
                              JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket), instance_id=instance_id)
    structlog.contextvars.bind_contextvars(verifier_id=service.instance_id)
    consumer = CommandConsumer(
        infra, cfg, "verifier", [cfg.names.events_all], service.handle, stream=cfg.names.events_stream,
        concurrency=concurrency or cfg.max_concurrent_runs,
        ack_wait_s=ack_wait_s if ack_wait_s is not None else cfg.command_ack_wait_s,
    )
    await consumer.run(stop)
