"""Recovery service: resolves ``dispatched`` intents whose executor is gone (docs/mutators.md).

Three ways in, one code path (:meth:`RecoveryService.recover_run`: load →
liveness and marker look-ups → :func:`reel.shared.core.mutators.recovery.decide` → one fenced
commit of the resolutions (:func:`reel.shared.application.fenced.commit_decided`), or a ``ResumeRun``):

* an ordered consumer on ``<ns>.ev.>`` keeps an :class:`IntentIndex` of runs
  with open intents (a hint; decisions are made on a fresh fold);
* a sweep every ``lease_ttl_s / 2`` seconds looks at the indexed runs whose
  open intents could now be acted on;
* the same sweep re-triggers the verifier (``VerifyRun`` on ``<ns>.cmd.verify.<run_id>``)
  for a run resting in ``verifying`` with no trigger queued — the executor died between
  its ``run_verifying`` commit and the trigger (:meth:`RecoveryService.retrigger`);
* the same sweep heals a run in ``pending`` or ``running`` with no open intent whose owner holds no
  lease, seen at the same head LSN on two passes in a row (no executor drives it: a start whose drive
  was lost, an owner that died between two commits): one ``ResumeRun``, deduplicated per (run, LSN),
  from the index's live runs only (:meth:`RecoveryService.idle_due`);
* the ``<ns>.cmd.recover`` command (``RecoverRuns{run_id?}``) scans one run, or
  every indexed run with an open intent once the index has caught up with the
  stream, and replies with what it resolved, resumed and left waiting.

The same pass commits the declared default of every input request whose deadline
has passed, and wakes every sleeping run whose timer is due (``run_woke``; services/recovery/deadlines.py);
the sweep wakes for the earliest of them.

Liveness is the executor's lease in the leases KV (an entry exists while the
executor heartbeats; the bucket's max age is the lease TTL). A lease that cannot
be read is treated as alive: recovery never guesses against a live executor.
Every commit is fenced on the head LSN recovery folded, so it lands above any
snapshot LSN and loses cleanly to a concurrent executor commit; the run is then
refreshed and decided again on the facts already looked up (an executor first
seen in the refreshed state is presumed alive until a later pass looks it up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
from nats.js import api as jsapi
from nats.js.errors import NotFoundError

from reel.shared.application.fenced import Decided, commit_decided
from reel.shared.core.errors import ReelError
from reel.shared.core.mutators import recovery
from reel.shared.core.ports import CommandBus, EventLog, Liveness, OutcomeMarkers
from reel.shared.core.run import timers
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.ids import ExecutorId
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.planning import has_open_intent
from reel.shared.core.run.state import DRIVABLE, VERIFYING, RunState
from reel.shared.core.wire.commands import RecoverRuns, Reply
from reel.shared.nats.commandbus import JetStreamCommandBus
from reel.shared.nats.consumer import CommandConsumer, Delivery, Router
from reel.shared.nats.consumergate import consumer_gate
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.nats.leases import KvLiveness
from reel.shared.nats.markers import KvOutcomeMarkers
from reel.shared.runtime.clock import now_ms
from reel.shared.runtime.config import Config

from .deadlines import fire_due, nap
from .index import IntentIndex

log = structlog.get_logger("reel.recovery")

WRITER = "recovery"
CATCH_UP_TIMEOUT_S = 10.0


class RunReport(msgspec.Struct, kw_only=True):
    """What one pass over one run did (the ``recover`` reply's detail is built from these)."""

    run_id: str
    resolved: list[dict[str, Any]] = []
    resumed: bool = False
    waiting: list[dict[str, Any]] = []
    deadlines: list[dict[str, Any]] = []


class RecoveryService:
    """The recovery logic over one NATS connection."""

    def __init__(self, infra: Infra, cfg: Config, events: EventLog, *, liveness: Liveness, markers: OutcomeMarkers,
                 bus: CommandBus) -> None:
        self.infra, self.cfg = infra, cfg
        self.log, self.liveness, self.markers, self.bus = events, liveness, markers, bus
        self.index = IntentIndex(cfg.names.events(""))
        self._verifying_seen: set[tuple[str, int]] = set()  # (run, verifying LSN) the previous retrigger saw
        self._idle_seen: set[tuple[str, int]] = set()  # (run, head LSN) of the idle drivable runs the last pass saw

    # ---- facts recovery cannot derive from the log ----------------------------------------
    async def live_set(self, executor_ids: Iterable[str]) -> set[str]:
        """The executors among ``executor_ids`` that hold a lease now."""
        ids = sorted(set(executor_ids))
        flags = await asyncio.gather(*(self.liveness.alive(e) for e in ids))
        return {e for e, alive in zip(ids, flags, strict=True) if alive}

    async def marker(self, key: str) -> BlobRef | None:
        """The output ref an executor stored before dying, if it got that far; ``None`` if it did not — then
        the key is claimed with :data:`~reel.shared.core.mutators.recovery.LOST_MARKER`
        (:meth:`OutcomeMarkers.claim_lost
        <reel.shared.core.ports.OutcomeMarkers.claim_lost>`: a marker that lands meanwhile wins, a later one is
        refused)."""
        return await self.markers.claim_lost(key)

    # ---- one run ---------------------------------------------------------------------------
    async def recover_run(self, run_id: str) -> RunReport:
        """Resolve what can be resolved in ``run_id`` now: load, look up leases and markers,
        :func:`reel.shared.core.mutators.recovery.decide`, one fenced commit
        (:func:`reel.shared.application.fenced.commit_decided`);
        then the defaults of the input requests whose deadline has passed and the timer, if due (:meth:`_deadlines`).

        Raises:
            RunNotFound: no such run.
            RunCorrupt: the run is corrupt (the index stops tracking it).
            ConcurrencyConflict: the run kept moving for every try of the retry policy.
        """
        try:
            return await self._recover_run(run_id)
        except RunCorrupt as exc:
            self.index.mark_corrupt(exc.corruption)
            raise

    async def _recover_run(self, run_id: str) -> RunReport:
        with structlog.contextvars.bound_contextvars(run_id=run_id):
            state = await self.log.load(run_id)
            intents = recovery.open_intents(state)
            if not intents:
                self.index.offer(state)
                return await self._deadlines(state, RunReport(run_id=state.run_id))
            dead, markers = await self._look_up(state, intents)
            at_ms = now_ms()
            done = await commit_decided(self.log, run_id,
                                        lambda s: recovery.decide(s, dead=dead, markers=markers, at_ms=at_ms),
                                        writer=WRITER, state=state, log_name="recovery")
            plan = recovery.plan(done.before, dead=dead, markers=markers)
            report = self._report(done, plan)
            if plan.resume:
                await self._resume(done.state)
                report.resumed = True
            self.index.offer(done.state)
            return await self._deadlines(done.state, report)

    async def _look_up(self, state: RunState, intents: Sequence[recovery.OpenIntent]
                       ) -> tuple[set[ExecutorId], dict[str, BlobRef | None]]:
        """The facts the log does not hold: which executors of ``intents`` are gone (no lease), and the
        outcome markers of their intents (a missing one claimed, :meth:`marker`)."""
        checked = recovery.executors_to_check(state, intents)
        dead = checked - await self.live_set(checked)
        return dead, {i.marker_key: await self.marker(i.marker_key) for i in intents if i.executor_id in dead}

    def _report(self, done: Decided, plan: recovery.Triage) -> RunReport:
        """What the pass ``done`` resolved (``plan``: its triage, on ``done.before``) and left waiting; logged."""
        before, commit = done.before, done.commit
        report = RunReport(run_id=before.run_id, waiting=[{**w.intent.describe(), "reason": w.reason}
                                                          for w in plan.waiting])
        for intent, event in zip(plan.resolve, commit.events if commit else (), strict=True):
            assert commit is not None  # a plan that resolves nothing decides a Skip
            outcome = recovery.outcome_of(event)
            report.resolved.append({**intent.describe(), "outcome": outcome, "lsn": commit.lsn})
            log.info("recovery.resolved", branch_id=intent.branch_id, step_id=intent.step_id,
                     attempt=intent.attempt, outcome=outcome, lsn=commit.lsn, executor_id=intent.executor_id,
                     inherited=intent.inherited, status=before.status, above_lsn=before.head_lsn)
        return report

    async def _deadlines(self, state: RunState, report: RunReport) -> RunReport:
        """``report`` with the defaults committed for the requests of ``state``'s run due now, and its timer's
        ``run_woke`` if due."""
        deadline, now = timers.next_due(state.status, state.active), now_ms()
        if deadline is not None and deadline <= now:
            report.deadlines = await fire_due(self.infra, self.cfg, self.log, state, now, writer=WRITER)
        return report

    async def _resume(self, state: RunState) -> None:
        await self.bus.resume(state.run_id, state.head_lsn)
        log.info("recovery.resume_published", branch_id=state.active_branch, lsn=state.head_lsn)

    # ---- sweeps ----------------------------------------------------------------------------
    async def actionable(self) -> list[str]:
        """Indexed runs whose open intents could be acted on now, plus runs the index must reload."""
        states = self.index.candidates()
        ids: set[str] = set()
        for s in states:
            ids |= recovery.executors_to_check(s, recovery.open_intents(s))
        live = await self.live_set(ids)
        due = [s.run_id for s in states if (t := recovery.triage(s, live)).resolve or t.resume]
        return sorted(set(due) | self.index.stale | self.index.due(now_ms()))

    async def idle_due(self) -> list[str]:
        """Drivable runs no executor drives: in ``pending``/``running`` with no open intent at the same head LSN
        as on the previous pass, their owner (if any) without a lease. Each gets one ``ResumeRun``
        (deduplicated per (run, LSN)); the run is read from the log first (the index is a hint)."""
        states = self.index.idle()
        now: set[tuple[str, int]] = {(s.run_id, s.head_lsn) for s in states}
        twice, self._idle_seen = now & self._idle_seen, now
        idle = [s for s in states if (s.run_id, s.head_lsn) in twice]
        live = await self.live_set(s.executor_id for s in idle if s.executor_id is not None)
        healed: list[str] = []
        for s in idle:
            if s.executor_id in live:
                continue
            try:
                state = await self.log.load(s.run_id)
            except RunCorrupt as exc:
                self.index.mark_corrupt(exc.corruption)
                continue
            except ReelError as exc:
                log.warning("recovery.run_skipped", run_id=s.run_id, code=exc.code, reason=exc.message)
                continue
            self.index.offer(state)
            if state.head_lsn != s.head_lsn or state.status not in DRIVABLE or has_open_intent(state):
                continue  # it moved since the index saw it: someone drives it
            await self._resume(state)
            log.info("recovery.idle_resumed", run_id=s.run_id, status=state.status, lsn=state.head_lsn,
                     owner=state.executor_id)
            healed.append(s.run_id)
        return healed

    async def sweep(self, *, every_open_run: bool = False) -> list[RunReport]:
        """One pass over every actionable run (or every run with an open intent, to report them all).

        A run that fails is logged and skipped; a corrupt one is skipped (the index logged it once).
        """
        reports: list[RunReport] = []
        if every_open_run:
            run_ids = sorted({s.run_id for s in self.index.candidates()} | self.index.stale | self.index.due(now_ms()))
        else:
            run_ids = await self.actionable()
        for run_id in run_ids:
            try:
                reports.append(await self.recover_run(run_id))
            except RunCorrupt:
                continue
            except ReelError as exc:
                log.warning("recovery.run_skipped", run_id=run_id, code=exc.code, reason=exc.message)
        return reports

    async def retrigger(self) -> list[str]:
        """Re-trigger the verifier for the runs resting in Verifying with no trigger queued; their ids.

        A run is looked at from the second pass that sees it in Verifying at the same LSN on (the
        executor's own trigger follows its commit at once). Its trigger subject is checked first and
        the run loaded after: a verifier acks a trigger only once its job committed ``run_completed``
        (or found the run moved), so a run still Verifying after its trigger is gone needs one. A
        re-trigger is deduplicated per (run, LSN) within the stream's window, and a job for a run
        already judged only completes it. A run that fails is logged and skipped; a corrupt one is
        dropped from the index (logged once).
        """
        now = set(self.index.verifying.items())
        due, self._verifying_seen = sorted(now & self._verifying_seen), now
        out: list[str] = []
        for run_id, _ in due:
            try:
                if await self._trigger_queued(run_id):
                    continue
                state = await self.log.load(run_id)
                self.index.offer(state)
                if state.status != VERIFYING or state.verifying_lsn is None:
                    continue
                await self.bus.verify(run_id, state.active_branch, state.verifying_lsn)
            except RunCorrupt as exc:  # never verified: the index stops tracking it
                self.index.mark_corrupt(exc.corruption)
                continue
            except Exception as exc:  # the next pass retries
                log.warning("recovery.retrigger_failed", run_id=run_id, error=str(exc))
                continue
            log.info("recovery.verify_retriggered", run_id=run_id, branch_id=state.active_branch,
                     lsn=state.verifying_lsn)
            out.append(run_id)
        return out

    async def _trigger_queued(self, run_id: str) -> bool:
        """True if a verification trigger of ``run_id`` is in the commands stream (queued or being judged)."""
        try:
            await self.infra.js.get_last_msg(self.cfg.names.commands_stream, self.cfg.names.verify(run_id))
        except NotFoundError:
            return False
        return True

    async def catch_up(self) -> bool:
        """Wait until the index has seen every commit in the stream as of now."""
        info = await self.infra.js.stream_info(self.cfg.names.events_stream)
        return await self.index.wait_for_seq(info.state.last_seq, CATCH_UP_TIMEOUT_S)

    async def sweep_loop(self, stop: asyncio.Event, interval_s: float) -> None:
        """Sweep every ``interval_s`` until ``stop`` (the first one once the index caught up)."""
        if not await self.catch_up():
            log.warning("recovery.index_behind", last_seq=self.index.last_seq)
        while not stop.is_set():
            try:
                reports = await self.sweep()
                await self.retrigger()
                await self.idle_due()
            except Exception:  # a sweep must never take the service down; the next one retries
                log.exception("recovery.sweep_failed")
                reports = []
            if any(r.resolved or r.resumed or r.deadlines for r in reports):
                log.info("recovery.swept", runs=len(reports), resolved=sum(len(r.resolved) for r in reports),
                         deadlines=sum(len(r.deadlines) for r in reports))
            self.index.deadlines_changed.clear()
            deadline = self.index.next_deadline()  # wake for the earliest deadline or timer, not a sweep later
            wait_s = interval_s if deadline is None else min(interval_s, max(0.02, (deadline - now_ms()) / 1000))
            await nap(stop, self.index.deadlines_changed, wait_s)

    def timer_report(self) -> dict[str, str]:
        """What ``reel status`` shows of the timers (``$SRV.STATS`` metadata): ``sleeping`` (how many runs this
        instance's index holds asleep) and ``next_wake`` (the earliest wake time, ISO-8601 UTC, and its run)."""
        asleep = self.index.sleeping()
        out = {"sleeping": str(len(asleep))}
        if asleep:
            wake, run_id = asleep[0]
            at = datetime.fromtimestamp(wake / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            out["next_wake"] = f"{at} {run_id}"
        return out

    # ---- the recover command -----------------------------------------------------------------
    async def recover(self, req: RecoverRuns, _: Delivery) -> Reply:
        """``RecoverRuns{run_id?}``: scan now, reply with what was resolved."""
        if req.run_id is not None:
            reports = [await self.recover_run(req.run_id)]
        else:
            if not await self.catch_up():
                raise ReelError("recovery's index is behind the event stream; retry")
            reports = await self.sweep(every_open_run=True)
        reply = Reply(ok=True, run_id=req.run_id, detail={
            "resolved": [r for rep in reports for r in rep.resolved],
            "resumed": [rep.run_id for rep in reports if rep.resumed],
            "waiting": [w for rep in reports for w in rep.waiting],
            "deadlines": [d for rep in reports for d in rep.deadlines],
            "runs_scanned": len(reports),
            **({} if req.run_id is not None else {"corrupt": [
                msgspec.to_builtins(bad) for _, bad in sorted(self.index.corrupt.items())]}),
        })
        log.info("recover.done", resolved=len(reply.detail["resolved"]), runs=len(reports))
        return reply


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, *, sweep: bool = True,
                sweep_interval_s: float | None = None, **_: Any) -> None:
    """Run one recovery instance until ``stop`` is set.

    Args:
        sweep: run the periodic sweep (tests turn it off to drive recovery by command only).
        sweep_interval_s: default ``lease_ttl_s / 2``.
    """
    service = RecoveryService(infra, cfg, JetStreamEventLog(infra.nc, cfg.names), liveness=KvLiveness(infra.leases),
                              markers=KvOutcomeMarkers(infra.outcomes), bus=JetStreamCommandBus(infra.nc, cfg.names))
    names = cfg.names
    sub = await infra.js.subscribe(names.events_all, stream=names.events_stream, cb=service.index.on_msg,
                                   ordered_consumer=True, deliver_policy=jsapi.DeliverPolicy.ALL)
    router = Router(infra)
    router.route(names.command("recover"), RecoverRuns, service.recover, rejected="recover.rejected")
    consumer = CommandConsumer(infra, cfg, "recovery", router.subjects, router,
                               ack_wait_s=cfg.mutator_ack_wait_s, report=service.timer_report)
    try:
        async with consumer_gate(infra.nc, names), asyncio.TaskGroup() as tg:  # clients' consumers, vetted
            tg.create_task(consumer.run(stop))
            if sweep:
                tg.create_task(service.sweep_loop(stop, sweep_interval_s or max(0.5, cfg.lease_ttl_s / 2)))
    finally:
        await sub.unsubscribe()
