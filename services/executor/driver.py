"""Driving one run: plan → perform → commit, on the state the executor materialized (brief §3).

:func:`shared.core.planning.next_action` decides from the folded state; the
:class:`Driver` performs the action (claim, an attempt, entering Verifying), applies
its commit to the state it holds and asks again, until the run rests or another
executor owns it. The state is loaded once per drive and then kept up to date
commit by commit (:func:`shared.fenced.commit_decided` is handed it): the run is
never re-read on the hot path. When a commit planned on that state loses the fence
(another writer committed first), the result is a NoCommit carrying the state
refreshed to the run's head: the driver yields if another executor owns the run,
else plans again.
"""

from __future__ import annotations

import asyncio

import structlog

from shared.clock import now_ms
from shared.core import planning as plan
from shared.core.errors import RunNotFound, WorkflowInvalid
from shared.core.events import BlobRef, RunStarted, RunVerifying
from shared.core.fold import DRIVABLE, RunState
from shared.core.ports import BlobStore, EventLog
from shared.core.workflow import ModelStep, WorkflowSpec, parse_workflow
from shared.fenced import NoCommit

from .attempts import Attempts, on_head

log = structlog.get_logger("reel.executor")


class HandedBack(Exception):
    """This executor is stopping: the run goes back to the queue (its command is nak'ed) between steps."""


class WorkflowSpecs:
    """The workflows this executor has loaded, by the sha256 of their blob (never evicted: specs are small)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self._specs: dict[str, WorkflowSpec] = {}

    def remember(self, sha256: str, spec: WorkflowSpec) -> None:
        """Keep ``spec``, stored as the blob ``sha256``."""
        self._specs[sha256] = spec

    async def load(self, ref: BlobRef) -> WorkflowSpec:
        """The workflow stored as ``ref`` (read and parsed once).

        Raises:
            BlobMissing: the blob store has no such (intact) blob.
            WorkflowInvalid: the blob is not a valid workflow.
        """
        spec = self._specs.get(ref.sha256)
        if spec is None:
            try:
                spec = parse_workflow(await self.blobs.get(ref), fmt="json")
            except WorkflowInvalid as exc:
                raise WorkflowInvalid(f"workflow blob {ref.sha256[:12]}…: {exc.message}") from exc
            self._specs[ref.sha256] = spec
        return spec


class Driver:
    """Drives runs for one executor (``attempts.executor_id``) until they rest.

    Args:
        stopping: set on shutdown: the attempt in flight finishes, then runs are handed back.
    """

    def __init__(self, log: EventLog, specs: WorkflowSpecs, attempts: Attempts, *,
                 stopping: asyncio.Event | None = None) -> None:
        self.log, self.specs, self.attempts = log, specs, attempts
        self.executor_id = attempts.executor_id
        self.stopping = stopping

    async def drive(self, run_id: str) -> RunState | None:
        """Drive ``run_id`` until it rests (Verifying, Completed, Cancelled) or another executor owns it.

        Returns the state the executor materialized when it stopped driving, or ``None``
        if there is no such run.

        Raises:
            HandedBack: the executor is stopping (between two steps).
            ConcurrencyConflict: an outcome lost the fence on every try of the one retry policy.
        """
        structlog.contextvars.bind_contextvars(run_id=run_id)
        try:
            state = await self.log.load(run_id)
        except RunNotFound:
            log.warning("run.not_found")
            return None
        spec = await self.specs.load(state.workflow_ref)
        claimed = False
        while True:
            action = plan.next_action(state, self.executor_id)
            if isinstance(action, plan.Rest):
                log.info("run.resting", status=action.status, lsn=state.head_lsn)
                return state
            if self.stopping is not None and self.stopping.is_set():
                log.info("run.handed_back", lsn=state.head_lsn, reason="executor stopping")
                raise HandedBack(state.run_id)
            if isinstance(action, plan.Claim):
                if claimed:  # we held it and another executor took it over: never take it back
                    log.info("run.yielded", owner=state.executor_id)
                    return state
                claimed = True
            done = await self._perform(state, spec, action)
            if not isinstance(done, NoCommit):
                state = done
                continue
            state = done.state  # someone else committed first: the run as it is now
            if state.executor_id not in (None, self.executor_id) and state.status in DRIVABLE:
                log.info("run.yielded", owner=state.executor_id)
                return state

    async def _perform(self, state: RunState, spec: WorkflowSpec, action: plan.Action) -> RunState | NoCommit:
        """Perform one action planned on ``state``: the state after it, or NoCommit if it lost the fence."""
        if isinstance(action, plan.Claim):
            claim = await self.attempts.intent(state, [RunStarted(executor_id=self.executor_id, at_ms=now_ms())])
            if not isinstance(claim, NoCommit):
                log.info("run.claimed", executor_id=self.executor_id, lsn=claim.head_lsn)
            return claim
        if isinstance(action, plan.EnterVerifying):
            events = [RunVerifying(branch_id=action.branch_id, at_ms=now_ms())]
            done = await self.attempts.commit(state, on_head(state.head_lsn, events))
            if isinstance(done, NoCommit):
                return done
            log.info("run.verifying", branch_id=action.branch_id, lsn=done.state.head_lsn)
            await self._snapshot(done.state, done.commit_id)
            return done.state
        assert isinstance(action, plan.Dispatch)
        step = spec.step(action.step_id)
        structlog.contextvars.bind_contextvars(step_id=action.step_id, attempt=action.attempt,
                                               branch_id=action.branch_id)
        try:
            if isinstance(step, ModelStep):
                return await self.attempts.model(state, spec, step, action)
            return await self.attempts.tool(state, step, action)
        finally:
            structlog.contextvars.unbind_contextvars("step_id", "attempt", "branch_id")

    async def _snapshot(self, state: RunState, commit_id: str) -> None:
        """Snapshot the state every verifier of this run pins (best effort: readers fall back to the log)."""
        try:
            store = await self.log.snapshots()
            if store is not None:
                await store.save(state, commit_id)
        except Exception as exc:  # a snapshot is only a shortcut; the run is already safely in Verifying
            log.warning("run.snapshot_failed", lsn=state.head_lsn, error=str(exc))
