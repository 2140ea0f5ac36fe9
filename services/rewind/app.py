"""Rewind service: ``<ns>.cmd.rewind`` → ``branch_forked`` + ``ResumeRun`` (brief §3; docs/mutators.md).

Per command: read the run's commits, fold, :func:`shared.core.rewind.decide`, commit
the fork fenced on the head LSN it folded (re-read and decide again on a
conflict), then publish ``ResumeRun`` on ``<ns>.cmd.resume`` with a
``Nats-Msg-Id`` derived from the fork's LSN, so an executor continues the run on
the new branch and a repeated publish is deduplicated — unless the run's live
owner is driving it (:func:`shared.core.rewind.needs_resume`): that executor's next
fenced commit conflicts with the fork and it continues on the new branch itself. The parent branch's
records are never changed; a verifier holding a view of it keeps it.

The new branch id is ``branch_id_for_key(run, key)``: the client's idempotency
key, or else one derived from the command message (``cmd:<Nats-Msg-Id or stream
seq>``), so a redelivered command finds its branch instead of forking twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from shared.clock import now_ms
from shared.config import Config
from shared.core import rewind
from shared.core.commands import Reply, RewindRun, decode_command, error_reply
from shared.core.errors import ConcurrencyConflict, InvalidCommand, ReelError, RunNotFound
from shared.core.fold import DRIVABLE, BranchState, RunState, fold
from shared.core.ids import LSN, BranchId, branch_id_for_key, is_token
from shared.nats.consumer import Ack, Command, CommandConsumer, send_reply
from shared.nats.eventlog import JetStreamEventLog
from shared.nats.infra import Infra
from shared.nats.leases import executor_alive
from shared.nats.publish import publish_resume

log = structlog.get_logger("reel.rewind")

WRITER = "rewind"
MAX_TRIES = 10


def _detail(branch: BranchState, **extra: Any) -> dict[str, Any]:
    return {"parent_branch_id": branch.parent_branch_id, "fork_lsn": branch.fork_lsn,
            "from_step": branch.from_step, **extra}


class RewindService:
    """Handles rewind commands against the event log."""

    def __init__(self, infra: Infra, cfg: Config) -> None:
        self.infra, self.cfg = infra, cfg
        self.log = JetStreamEventLog(infra.nc, cfg.names)

    async def handle(self, cmd: Command) -> Ack:
        """Decode, fork (with fenced retries), resume, reply; every refusal is a reply, never a crash."""
        try:
            req = decode_command(cmd.data, RewindRun)
            if not is_token(req.run_id):
                raise InvalidCommand(f"run_id {req.run_id!r} is not a valid run id")
            structlog.contextvars.bind_contextvars(run_id=req.run_id)
            key = req.idempotency_key or f"cmd:{cmd.identity}"
            reply = await self._rewind(req, branch_id_for_key(req.run_id, key))
        except ReelError as exc:
            log.warning("rewind.rejected", code=exc.code, reason=exc.message, stream_seq=cmd.stream_seq)
            reply = error_reply(exc)
        await send_reply(self.infra, cmd, reply)
        return Ack.ACK

    async def _load(self, run_id: str) -> tuple[RunState, list[int]]:
        commits = await self.log.read(run_id)
        state = fold(commits)
        if state is None:
            raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
        return state, [lsn for lsn, _ in commits]

    async def _rewind(self, req: RewindRun, branch_id: BranchId) -> Reply:
        structlog.contextvars.bind_contextvars(branch_id=branch_id)
        for attempt in range(1, MAX_TRIES + 1):
            state, lsns = await self._load(req.run_id)
            decision = rewind.decide(state, lsns, req, branch_id=branch_id, at_ms=now_ms())
            if isinstance(decision, rewind.ExistingBranch):
                return await self._existing(state, decision.branch)
            event = decision.event
            try:
                lsn = await self.log.commit(state.run_id, [event], expected_lsn=state.head_lsn, writer=WRITER)
            except ConcurrencyConflict:
                log.info("rewind.conflict", expected_lsn=state.head_lsn, attempt=attempt)
                await asyncio.sleep(0.01 * attempt)
                continue
            log.info("rewind.forked", parent_branch_id=event.parent_branch_id, fork_lsn=event.fork_lsn,
                     from_step=event.from_step, lsn=lsn, previous_status=state.status)
            resume = await self._maybe_resume(state, lsn)
            return Reply(ok=True, run_id=state.run_id, status="running", created=True, branch_id=branch_id,
                         lsn=LSN(lsn),
                         detail={"parent_branch_id": event.parent_branch_id, "fork_lsn": event.fork_lsn,
                                 "from_step": event.from_step, "resume": resume})
        raise ConcurrencyConflict(f"run {req.run_id} kept moving; rewind not committed after {MAX_TRIES} tries",
                                  run_id=req.run_id)

    async def _existing(self, state: RunState, branch: BranchState) -> Reply:
        """A repeated rewind: same branch, no commit; re-send the (deduplicated) resume if still pending."""
        log.info("rewind.exists", created_lsn=branch.created_lsn, status=state.status)
        resume = "not_needed"
        if state.active_branch == branch.branch_id and state.status in DRIVABLE:
            resume = await self._maybe_resume(state, branch.created_lsn)
        return Reply(ok=True, run_id=state.run_id, status=state.status, created=False, branch_id=branch.branch_id,
                     lsn=branch.created_lsn, detail=_detail(branch, resume=resume))

    async def _maybe_resume(self, state: RunState, fork_commit_lsn: int) -> str:
        """Publish ``ResumeRun`` (deduplicated by the fork's LSN) unless the live owner drives the run."""
        if not rewind.needs_resume(state, await executor_alive(self.infra.leases, state.executor_id)):
            log.info("rewind.owner_driving", executor_id=state.executor_id, lsn=fork_commit_lsn)
            return "owner_driving"
        await publish_resume(self.infra.js, self.cfg.names, state.run_id, fork_commit_lsn)
        log.info("rewind.resume_published", lsn=fork_commit_lsn)
        return "published"


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, **_: Any) -> None:
    """Run one rewind service instance until ``stop`` is set."""
    service = RewindService(infra, cfg)
    consumer = CommandConsumer(infra, cfg, "rewind", [cfg.names.command("rewind")], service.handle)
    await consumer.run(stop)
