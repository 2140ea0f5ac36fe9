"""Rewind service: ``<ns>.cmd.rewind`` → ``branch_forked`` + ``ResumeRun`` (docs/mutators.md).

Per command: load the run and its commits, :func:`reel.shared.core.mutators.rewind.decide`,
commit the fork fenced on the head (:func:`reel.shared.application.fenced.commit_decided`: refreshed
and decided again on a conflict), then publish ``ResumeRun`` on ``<ns>.cmd.resume`` with a
``Nats-Msg-Id`` derived from the fork's LSN, so an executor continues the run on
the new branch and a repeated publish is deduplicated — unless the run's live
owner is driving it (:func:`reel.shared.core.mutators.rewind.needs_resume`): that executor's next
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

from reel.services.runtime.resume import resume_unless_driven
from reel.shared.application.fenced import Refresh, commit_decided
from reel.shared.core.mutators import rewind
from reel.shared.core.ports import EventLog
from reel.shared.core.run.events import Commit
from reel.shared.core.run.ids import branch_id_for_key
from reel.shared.core.run.state import DRIVABLE, BranchState, RunState
from reel.shared.core.wire.commands import Reply, RewindRun
from reel.shared.nats.consumer import CommandConsumer, Delivery, Router
from reel.shared.nats.consumergate import consumer_gate
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.clock import now_ms
from reel.shared.runtime.config import Config

log = structlog.get_logger("reel.rewind")

WRITER = "rewind"


def _detail(branch: BranchState, **extra: Any) -> dict[str, Any]:
    return {"parent_branch_id": branch.parent_branch_id, "fork_lsn": branch.fork_lsn,
            "from_step": branch.from_step, **extra}


class RewindService:
    """Handles rewind commands against the event log."""

    def __init__(self, infra: Infra, cfg: Config, events: EventLog) -> None:
        self.infra, self.cfg = infra, cfg
        self.log = events

    async def rewind(self, req: RewindRun, cmd: Delivery) -> Reply:
        """Fork (fenced, re-decided on conflicts), resume, reply."""
        key = req.idempotency_key or f"cmd:{cmd.identity}"
        branch_id = branch_id_for_key(req.run_id, key)
        structlog.contextvars.bind_contextvars(branch_id=branch_id)
        state, commits, refresh = await self._load(req.run_id)
        at_ms = now_ms()
        done = await commit_decided(self.log, req.run_id,
                                    lambda s: rewind.decide(s, commits, req, branch_id=branch_id, at_ms=at_ms),
                                    writer=WRITER, state=state, refresh=refresh)
        if done.commit is None:  # the key's branch exists
            return await self._existing(done.before, done.before.branches[branch_id])
        lsn, fork = done.commit.lsn, done.commit.state.branches[branch_id]
        log.info("rewind.forked", parent_branch_id=fork.parent_branch_id, fork_lsn=fork.fork_lsn,
                 from_step=fork.from_step, lsn=lsn, previous_status=done.before.status)
        resume = await self._maybe_resume(done.before, lsn)
        return Reply(ok=True, run_id=req.run_id, status="running", created=True, branch_id=branch_id, lsn=lsn,
                     detail=_detail(fork, resume=resume))

    async def _load(self, run_id: str) -> tuple[RunState, list[tuple[int, Commit]], Refresh]:
        """The run, every ``(lsn, commit)`` of it (the lineage needs them all), and a refresh that keeps the
        commits in step with the state after a lost fence.

        Raises:
            RunNotFound: no such run.
        """
        state = await self.log.load(run_id)
        commits = await self.log.read(run_id, upto_lsn=state.head_lsn)

        async def refresh(s: RunState) -> RunState:
            s, new = await self.log.refresh(s)
            commits.extend(new)
            return s
        return state, commits, refresh

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
        if not await resume_unless_driven(self.infra, self.cfg.names, state, fork_commit_lsn):
            log.info("rewind.owner_driving", executor_id=state.executor_id, lsn=fork_commit_lsn)
            return "owner_driving"
        log.info("rewind.resume_published", lsn=fork_commit_lsn)
        return "published"


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, **_: Any) -> None:
    """Run one rewind service instance until ``stop`` is set."""
    service = RewindService(infra, cfg, JetStreamEventLog(infra.nc, cfg.names))
    router = Router(infra)
    router.route(cfg.names.command("rewind"), RewindRun, service.rewind, rejected="rewind.rejected")
    async with consumer_gate(infra.nc, cfg.names):  # clients' consumers, vetted (docs/security.md)
        await CommandConsumer(infra, cfg, "rewind", router.subjects, router,
                              ack_wait_s=cfg.mutator_ack_wait_s).run(stop)
