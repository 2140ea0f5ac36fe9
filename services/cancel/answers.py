"""The respond command, hosted by the cancel service: ``<ns>.cmd.respond`` → ``input_answered`` (docs/mutators.md).

Both commands are a person's word on a run that an executor does not own: stop it, or
answer what it asked. Per command: load the run and its workflow (for the tool's
``parameters``, to validate edited arguments), :func:`reel.shared.core.input.respond.decide`, commit
fenced on the head (:func:`reel.shared.application.fenced.commit_decided`: refreshed and decided again on a
conflict). Then an executor is asked to go on (``ResumeRun``, deduplicated by the answer's
LSN) unless the run's live owner is driving it (:func:`reel.shared.core.mutators.rewind.needs_resume`: a
run that was ``awaiting_input`` always gets one; one still ``running`` — other calls of the
turn in flight — is picked up by its owner's next fenced commit).
"""

from __future__ import annotations

from typing import Any

import structlog

from reel.services.runtime.resume import resume_unless_driven
from reel.shared.application.fenced import commit_decided
from reel.shared.application.workflows import WorkflowCache
from reel.shared.core.input import respond
from reel.shared.core.ports import BlobStore, EventLog
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.commands import Reply, RespondRun
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.consumer import Delivery, Router
from reel.shared.nats.infra import Infra
from reel.shared.runtime.clock import now_ms
from reel.shared.runtime.config import Config

log = structlog.get_logger("reel.respond")

WRITER = "respond"


class RespondService:
    """Handles respond commands: the event log, the blob store (workflows), the leases and the command stream."""

    def __init__(self, infra: Infra, cfg: Config, events: EventLog, blobs: BlobStore) -> None:
        self.infra, self.cfg, self.log, self.blobs = infra, cfg, events, blobs
        self.specs = WorkflowCache(blobs)

    async def respond(self, req: RespondRun, _: Delivery) -> Reply:
        """Answer ``req.request_id`` of ``req.run_id`` (fenced, re-decided on conflicts); the reply.

        Raises:
            RunNotFound, RequestNotFound, RequestAnswered, InvalidCommand: refused (an error reply).
        """
        structlog.contextvars.bind_contextvars(request_id=req.request_id)
        state = await self.log.load(req.run_id)
        spec = await self.specs.load(state.workflow_ref)
        at_ms = now_ms()
        done = await commit_decided(self.log, req.run_id, lambda s: respond.decide(s, req, spec, at_ms=at_ms),
                                    writer=WRITER, state=state)
        before, commit = done.before, done.commit
        detail: dict[str, Any] = {"request_id": req.request_id, "decision": req.decision}
        if commit is None:
            log.info("respond.noop", status=before.status, reason=done.reason, lsn=before.head_lsn)
            return Reply(ok=True, run_id=req.run_id, status=before.status,
                         detail={**detail, "noop": True, "reason": done.reason})
        resume = await self._maybe_resume(before, commit.lsn)
        log.info("respond.committed", decision=req.decision, lsn=commit.lsn, previous_status=before.status,
                 resume=resume)
        return Reply(ok=True, run_id=req.run_id, status=commit.state.status, lsn=commit.lsn,
                     detail={**detail, "previous_status": before.status, "resume": resume})

    async def _maybe_resume(self, state: RunState, lsn: int) -> str:
        """``ResumeRun`` (deduplicated by the answer's LSN) unless the live owner drives ``state`` (before it)."""
        return "published" if await resume_unless_driven(self.infra, self.cfg.names, state, lsn) else "owner_driving"


def route(router: Router, infra: Infra, cfg: Config, events: EventLog) -> None:
    """Add ``<ns>.cmd.respond`` to the cancel service's router."""
    blobs = JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)
    service = RespondService(infra, cfg, events, blobs)
    router.route(cfg.names.command("respond"), RespondRun, service.respond, rejected="respond.rejected")
