"""``run_loop``: drive the gates, run a typed iteration, fold the result into ``Run`` (ADR 0004).

The loop never assigns to ``Run``: :meth:`Driver.commit` appends events to the
session log (one writer, guarded, LSN = stream sequence) and folds them with the
same pure :func:`shared.crucible.fold.apply` that ``resume`` uses, so the live
state *is* a re-fold of the log. Every transition, gate decision, reading and
row is an event (see :mod:`shared.crucible.events`).

Per iteration: gates (:mod:`services.crucible.gates`), then the proposer edits
the world, then ``Iteration[Proposed] → apply → Iteration[Applied] → measure →
Iteration[Measured] → decide → Decided``; a keep leaves the world at the new
best, anything else rolls it back to the best snapshot. Every break site that
ends the run commits its ``SessionEnded`` in the same commit as its cause.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog

from services.crucible import gates
from services.crucible.judge import Judge, Unavailable
from services.crucible.proposer import Proposal, ProposeContext, Proposer
from services.crucible.sessionlog import SessionLog
from services.crucible.world import GitWorld
from shared.core.errors import ReelError
from shared.core.events import BlobRef
from shared.core.ports import BlobStore
from shared.crucible import budget
from shared.crucible.config import Regime, SessionConfig
from shared.crucible.events import (
    AnySessionEvent,
    ApplyFailed,
    CandidateApplied,
    CandidateDenied,
    Escalated,
    FingerprintChanged,
    IterationClosed,
    MeasureFinished,
    MeasureStarted,
    ParkEnded,
    ParkStarted,
    ProposalMade,
    ProposalOutcome,
    ProvisioningBlocked,
    ProvisioningCleared,
    SegmentOpened,
    SegmentReason,
    SessionEnded,
)
from shared.crucible.fold import SessionState, apply_commit
from shared.crucible.iteration import Applied, CandidateChange, Iteration, Measured, gate_row
from shared.crucible.noise import goal_met
from shared.crucible.state import Fate, InvalidReading, LoopExit, Measurement, Reading, Row, Run, WorldSha

log = structlog.get_logger("reel.crucible")


def now_ms() -> int:
    """Wall clock, epoch ms (the only clock read that reaches the log)."""
    return int(time.time() * 1000)


def _ms_since(t0: float) -> int:
    return int((time.perf_counter() - t0) * 1000)


@dataclass
class Driver:
    """One session being driven: its folded state and the ports the loop uses."""

    state: SessionState
    log: SessionLog
    world: GitWorld
    proposer: Proposer
    blobs: BlobStore
    stop: asyncio.Event
    fingerprint_parts: dict[str, str] = field(default_factory=dict)
    _judges: dict[str, Judge] = field(default_factory=dict)

    @property
    def cfg(self) -> SessionConfig:
        return self.state.started.config

    @property
    def session_id(self) -> str:
        return self.state.session_id

    @property
    def run(self) -> Run:
        assert self.state.run is not None, "no baseline yet"
        return self.state.run

    def regime(self) -> Regime:
        return self.cfg.regime(self.run.segment.regime)

    def judge(self, regime: Regime) -> Judge:
        if regime.name not in self._judges:
            self._judges[regime.name] = Judge(regime.judge, self.world.root)
        return self._judges[regime.name]

    async def commit(self, *events: AnySessionEvent) -> int:
        """Append ``events`` as one commit and fold them into the state; the commit's LSN.

        Raises:
            SessionBusy: another writer moved the session's log.
        """
        lsn, commit = await self.log.append(self.session_id, events, expected_lsn=self.state.lsn)
        self.state = apply_commit(self.state, lsn, commit)
        for e in events:
            log.debug("crucible.event", type=type(e).__name__, lsn=lsn)
        return lsn

    async def end(self, exit_: LoopExit, reason: str, *before: AnySessionEvent) -> LoopExit:
        """Commit ``before`` and the ``SessionEnded`` together (one atomic commit); return the exit."""
        await self.commit(*before, SessionEnded(exit=exit_, reason=reason, at_ms=now_ms()))
        log.info("crucible.ended", exit=exit_.value, exit_code=exit_.exit_code, reason=reason)
        return exit_

    async def best(self) -> WorldSha:
        """Roll the world back to the best snapshot (or the base, before any baseline); that snapshot."""
        snap = self.run.segment.best_snap if self.state.run is not None else WorldSha(self.state.started.base_sha)
        await self.world.rollback(snap)
        return snap


# ---- segments ---------------------------------------------------------------------------------


async def open_segment(d: Driver, regime: Regime, reason: SegmentReason) -> LoopExit | None:
    """Measure a baseline of the current best snapshot under ``regime`` and open its segment.

    The one call behind both the initial baseline and a rescope (ADR 0004
    Implementation notes): the fold assigns ``run.segment = Segment.baseline(...)``.
    An invalid baseline escalates (there is no goalpost to measure against).
    """
    t0 = time.perf_counter()
    snap = await d.best()
    judge = d.judge(regime)
    fp = await judge.fingerprint()
    repeats = max(regime.judge.repeats, d.cfg.noise.baseline_repeats)
    reading = await _measure_waiting(d, judge, repeats)
    if isinstance(reading, LoopExit):
        return reading
    if isinstance(reading, InvalidReading):
        why = f"baseline of regime {regime.name} is invalid: {reading.reason}"
        return await d.end(LoopExit.ESCALATED, why, Escalated(reason=why, at_ms=now_ms()))
    d.fingerprint_parts = fp.parts
    await d.commit(SegmentOpened(
        regime=regime.name, reason=reason, fingerprint=fp.digest,
        fingerprint_parts=fp.parts, reading=reading, snap=snap,
        goal_met=goal_met(regime.judge.direction, reading.score, regime.goal), wall_ms=_ms_since(t0), at_ms=now_ms(),
    ))
    log.info("crucible.segment", regime=regime.name, reason=reason, baseline=reading.score, snap=snap[:12])
    return None


async def _measure_waiting(d: Driver, judge: Judge, repeats: int) -> Measurement | LoopExit:
    """A baseline measurement, waiting out an unavailable judge (up to ``gates.max_block_s``)."""
    t0 = time.perf_counter()
    while True:
        got = await judge.measure(repeats)
        if not isinstance(got, Unavailable):
            return got
        if _ms_since(t0) > d.cfg.gates.max_block_s * 1000:
            why = f"judge unavailable for the baseline longer than {d.cfg.gates.max_block_s:g}s: {got.reason}"
            return await d.end(LoopExit.ESCALATED, why, Escalated(reason=why, at_ms=now_ms()))
        if await gates.wait(d.stop, d.cfg.gates.retry_s):
            return await d.end(LoopExit.STOPPED, "stop requested while the judge was unavailable")


# ---- gates ------------------------------------------------------------------------------------


async def run_gates(d: Driver) -> LoopExit | None:
    """Gates before an iteration enters ``Proposed``; an exit ends the run, ``None`` lets it go."""
    while True:
        if d.stop.is_set():
            return await d.end(LoopExit.STOPPED, "stop requested")
        run, regime = d.run, d.regime()
        if run.rescope_to is not None:
            ended = await open_segment(d, d.cfg.regime(run.rescope_to), "rescope")
        elif goal_met(regime.judge.direction, run.segment.best_score, regime.goal):
            nxt = d.cfg.next_regime(regime.name)
            if nxt is None:
                return await d.end(LoopExit.SOLVED, f"regime {regime.name}: goal {regime.goal:g} reached "
                                                    f"(best {run.segment.best_score:.6g})")
            ended = await open_segment(d, nxt, "rescope")
        else:
            break
        if ended is not None:
            return ended
    due = budget.exhausted(d.run, d.cfg.budget)
    if due is not None:
        return await d.end(*due)
    return await park_gate(d)


async def park_gate(d: Driver) -> LoopExit | None:
    """Hold the loop while the park probe says wait (time excluded from the budget)."""
    spec = d.cfg.gates.park
    if spec is None:
        return None
    got = await gates.probe(spec, d.world.root)
    if isinstance(got, gates.Go):
        return None
    it = d.run.next_it
    t0 = time.perf_counter()
    if isinstance(got, gates.Park):
        await d.commit(ParkStarted(it=it, reason=got.reason, at_ms=now_ms()))
        log.info("crucible.parked", it=it, reason=got.reason)
        while isinstance(got, gates.Park):
            if await gates.wait(d.stop, spec.poll_s):
                ended = ParkEnded(it=it, parked_ms=_ms_since(t0), at_ms=now_ms())
                return await d.end(LoopExit.STOPPED, "stop requested while parked", ended)
            got = await gates.probe(spec, d.world.root)
        await d.commit(ParkEnded(it=it, parked_ms=_ms_since(t0), at_ms=now_ms()))
    if isinstance(got, gates.Broken):
        return await d.end(LoopExit.ESCALATED, got.reason, Escalated(it=it, reason=got.reason, at_ms=now_ms()))
    return None


# ---- one iteration ----------------------------------------------------------------------------


@dataclass
class Tally:
    """What one iteration has cost so far: proposer calls (USD) and its start (perf counter)."""

    it: int
    t0: float = field(default_factory=time.perf_counter)
    cost_usd: float = 0.0

    @property
    def wall_ms(self) -> int:
        return _ms_since(self.t0)


async def iterate(d: Driver) -> LoopExit | None:
    """One iteration: propose (waiting out a blocked proposer), gate, then the typed protocol."""
    tally = Tally(it=d.run.next_it)
    structlog.contextvars.bind_contextvars(it=tally.it)
    try:
        proposal = await _propose(d, tally)
        if isinstance(proposal, LoopExit):
            return proposal
        return await _after_proposal(d, tally, proposal)
    finally:
        structlog.contextvars.unbind_contextvars("it")


async def _propose(d: Driver, tally: Tally) -> Proposal | LoopExit:
    regime = d.regime()
    while True:
        ctx = ProposeContext(session_id=d.session_id, it=tally.it, regime=regime,
                             best_score=d.run.segment.best_score, rows=d.run.rows, world=d.world)
        proposal = await d.proposer.propose(ctx)
        tally.cost_usd += proposal.cost_usd
        if proposal.kind != "blocked":
            return proposal
        await d.best()  # drop any partial edit before waiting
        await d.commit(ProvisioningBlocked(it=tally.it, resource="proposer", reason=proposal.detail,
                                           cost_usd=proposal.cost_usd, at_ms=now_ms()))
        waited = await _wait_block(d, tally)
        if waited is not None:
            return waited
        await _cleared(d, tally, "proposer")


async def _wait_block(d: Driver, tally: Tally) -> LoopExit | None:
    """Wait ``retry_s`` while the iteration is blocked; an exit if stopped or blocked too long."""
    block = d.run.pending_block
    assert block is not None
    blocked_ms = now_ms() - block.since_ms
    if blocked_ms > d.cfg.gates.max_block_s * 1000:
        why = (f"{block.resource} unavailable for {blocked_ms / 1000:.1f}s (> {d.cfg.gates.max_block_s:g}s): "
               f"{block.reason}")
        await d.best()
        return await _close_and_end(d, tally, LoopExit.ESCALATED, Fate.ESCALATED, why, blocked_ms,
                                    Escalated(it=tally.it, reason=why, at_ms=now_ms()))
    if await gates.wait(d.stop, d.cfg.gates.retry_s):
        await d.best()
        return await _close_and_end(d, tally, LoopExit.STOPPED, Fate.ABANDONED,
                                    f"stop requested while {block.resource} was unavailable", now_ms() - block.since_ms)
    return None


async def _cleared(d: Driver, tally: Tally, resource: str) -> None:
    block = d.run.pending_block
    if block is not None:
        await d.commit(ProvisioningCleared(it=tally.it, resource=resource, waited_ms=now_ms() - block.since_ms,
                                           at_ms=now_ms()))


async def _close_and_end(d: Driver, tally: Tally, exit_: LoopExit, verdict: Fate, reason: str, waited_ms: int,
                         *extra: AnySessionEvent) -> LoopExit:
    cleared: tuple[AnySessionEvent, ...] = ()
    if d.run.pending_block is not None:
        b = d.run.pending_block
        cleared = (ProvisioningCleared(it=tally.it, resource=b.resource, waited_ms=waited_ms, at_ms=now_ms()),)
    row = _row(d, tally, verdict, reason)
    return await d.end(exit_, reason, *cleared, *extra, IterationClosed(row=row, at_ms=now_ms()))


def _row(d: Driver, tally: Tally, verdict: Fate, reason: str, note: str = "", diffstat: str = "") -> Row:
    return gate_row(it=tally.it, regime=d.run.segment.regime, verdict=verdict, best_score=d.run.segment.best_score,
                    reason=reason, note=note, diffstat=diffstat, cost_usd=tally.cost_usd, wall_ms=tally.wall_ms)


async def _close(d: Driver, row: Row, *before: AnySessionEvent) -> None:
    await d.commit(*before, IterationClosed(row=row, at_ms=now_ms()))
    log.info("crucible.iteration", verdict=row.verdict.value, score=row.score, delta=row.delta,
             best=row.best_score, sha=(row.sha or "")[:12], reason=row.reason, wall_ms=row.wall_ms)


@dataclass(frozen=True)
class _Made:
    """Builds the iteration's ``ProposalMade`` once the outcome is known."""

    it: int
    p: Proposal
    prompt: BlobRef | None

    def __call__(self, outcome: ProposalOutcome, *, detail: str = "", paths: tuple[str, ...] = (),
                 diffstat: str = "", patch: BlobRef | None = None) -> ProposalMade:
        p = self.p
        return ProposalMade(it=self.it, outcome=outcome, note=p.note, paths=paths, diffstat=diffstat, patch=patch,
                            prompt=self.prompt, cost_usd=p.cost_usd, proposer_ms=p.proposer_ms, detail=detail,
                            at_ms=now_ms())


async def _after_proposal(d: Driver, tally: Tally, p: Proposal) -> LoopExit | None:
    made = _Made(tally.it, p, await d.blobs.put(p.prompt.encode()) if p.prompt else None)
    if p.kind == "edited":
        return await _candidate(d, tally, p, made)
    await d.best()
    if p.kind == "failed":
        await _close(d, _row(d, tally, Fate.FAILED, p.detail, p.note), made("failed", detail=p.detail))
        return None
    if p.kind == "escalate":
        await d.commit(made("escalate", detail=p.detail))
        why = f"proposer escalated: {p.detail}"
        return await _close_and_end(d, tally, LoopExit.ESCALATED, Fate.ESCALATED, why, 0,
                                    Escalated(it=tally.it, reason=why, at_ms=now_ms()))
    if p.kind == "done":
        await d.commit(made("done", detail=p.detail))
        why = "proposer has nothing more to propose" + (f": {p.detail}" if p.detail else "")
        return await _close_and_end(d, tally, LoopExit.FINISHED, Fate.SKIP, why, 0)
    assert p.kind == "rescope"
    if p.detail not in {r.name for r in d.cfg.regimes}:
        why = f"rescope to unknown regime {p.detail!r}"
        await _close(d, _row(d, tally, Fate.FAILED, why, p.note), made("failed", detail=why))
        return None
    await _close(d, _row(d, tally, Fate.SKIP, f"rescope to {p.detail} requested", p.note),
                 made("rescope", detail=p.detail))
    return None


async def _candidate(d: Driver, tally: Tally, p: Proposal, made: _Made) -> LoopExit | None:
    staged = await d.world.stage()
    if staged.empty:
        await _close(d, _row(d, tally, Fate.SKIP, "empty diff: nothing to measure", p.note), made("empty"))
        return None
    patch = await d.blobs.put(staged.patch, "text/x-diff")
    await d.commit(made("candidate", paths=staged.paths, diffstat=staged.diffstat, patch=patch))
    bad = gates.denied(staged.paths, d.state.started.protected)
    if bad:
        await d.best()
        why = f"candidate touches protected paths: {', '.join(bad)}"
        row = _row(d, tally, Fate.DENIED, why, p.note, staged.diffstat)
        denial = CandidateDenied(it=tally.it, paths=bad, reason=why, at_ms=now_ms())
        if d.cfg.gates.on_deny == "escalate":
            return await d.end(LoopExit.ESCALATED, why, denial, IterationClosed(row=row, at_ms=now_ms()),
                               Escalated(it=tally.it, reason=why, at_ms=now_ms()))
        await _close(d, row, denial)
        return None
    proposed = Iteration.propose(tally.it, d.run.segment.regime,
                                 CandidateChange(note=p.note, paths=staged.paths, diffstat=staged.diffstat,
                                           cost_usd=tally.cost_usd))
    try:
        sha = await d.world.apply(tally.it, p.note)
    except ReelError as exc:
        await d.best()
        await _close(d, _row(d, tally, Fate.FAILED, exc.message, p.note, staged.diffstat),
                     ApplyFailed(it=tally.it, error=exc.message, at_ms=now_ms()))
        return None
    applied = proposed.apply(sha)
    await d.commit(CandidateApplied(it=tally.it, sha=sha, at_ms=now_ms()))
    return await _measure_and_decide(d, tally, applied)


async def _measure_and_decide(d: Driver, tally: Tally, applied: Iteration[Applied]) -> LoopExit | None:
    measured = await measure(d, tally, applied)
    if isinstance(measured, LoopExit):
        return measured
    incumbent = await _incumbent(d, tally, applied, measured)
    if isinstance(incumbent, LoopExit):
        return incumbent
    regime = d.regime()
    decided = measured.decide(segment=d.run.segment, direction=regime.judge.direction, noise=d.cfg.noise,
                              goal=regime.goal, wall_ms=tally.wall_ms, incumbent=incumbent)
    if decided.verdict is not Fate.KEEP:
        await d.best()
    await _close(d, decided.row)
    return None


async def _fingerprint_ok(d: Driver, tally: Tally, applied: Iteration[Applied]) -> str | LoopExit:
    """The judge's fingerprint if it still matches the segment's; else stop the run (no moved goalposts)."""
    fp = await d.judge(d.regime()).fingerprint()
    expected = d.run.segment.fingerprint
    if fp.digest == expected:
        return fp.digest
    await d.best()
    changed = fp.changed(d.fingerprint_parts) if d.fingerprint_parts else ()
    why = f"judge fingerprint changed ({', '.join(changed) or 'digest'}); not measuring against a moved goalpost"
    row = applied.abandon(best_score=d.run.segment.best_score, reason=why, wall_ms=tally.wall_ms)
    return await d.end(LoopExit.STOPPED, why,
                       FingerprintChanged(it=tally.it, expected=expected, actual=fp.digest, changed=changed,
                                          at_ms=now_ms()),
                       IterationClosed(row=row, at_ms=now_ms()))


async def measure(d: Driver, tally: Tally, applied: Iteration[Applied]) -> Iteration[Measured] | LoopExit:
    """Applied → Measured: check the fingerprint, run the judge, wait out an unavailable judge (not a discard)."""
    regime = d.regime()
    while True:
        digest = await _fingerprint_ok(d, tally, applied)
        if isinstance(digest, LoopExit):
            return digest
        await d.commit(MeasureStarted(it=tally.it, fingerprint=digest, at_ms=now_ms()))
        got = await d.judge(regime).measure(regime.judge.repeats)
        if isinstance(got, Unavailable):
            await d.commit(ProvisioningBlocked(it=tally.it, resource="judge", reason=got.reason, at_ms=now_ms()))
            log.info("crucible.blocked", resource="judge", reason=got.reason)
            waited = await _wait_block(d, tally)
            if waited is not None:
                return waited
            continue
        await _cleared(d, tally, "judge")
        await d.commit(MeasureFinished(it=tally.it, reading=got, at_ms=now_ms()))
        return applied.measure(got)


async def _incumbent(d: Driver, tally: Tally, applied: Iteration[Applied],
                     measured: Iteration[Measured]) -> Reading | LoopExit | None:
    """Re-measure the best snapshot before promoting a candidate (``noise.remeasure_incumbent``)."""
    regime, seg = d.regime(), d.run.segment
    if not d.cfg.noise.remeasure_incumbent:
        return None
    if not measured.promotes(segment=seg, direction=regime.judge.direction, noise=d.cfg.noise):
        return None  # not a promotion: nothing to re-check
    await d.world.rollback(seg.best_snap)
    digest = await _fingerprint_ok(d, tally, applied)
    if isinstance(digest, LoopExit):
        return digest
    await d.commit(MeasureStarted(it=tally.it, target="incumbent", fingerprint=digest, at_ms=now_ms()))
    got = await d.judge(regime).measure(regime.judge.repeats)
    await d.world.rollback(measured.state.sha)
    recorded = got if not isinstance(got, Unavailable) else InvalidReading(reason=f"unavailable: {got.reason}")
    await d.commit(MeasureFinished(it=tally.it, target="incumbent", reading=recorded, at_ms=now_ms()))
    return recorded if isinstance(recorded, Reading) else None


# ---- the loop ---------------------------------------------------------------------------------


async def run_loop(d: Driver) -> LoopExit:
    """Drive gates, then a typed iteration, folding each result into ``Run``, until a ``LoopExit``."""
    structlog.contextvars.bind_contextvars(session_id=d.session_id)
    while True:
        ended = await run_gates(d)
        if ended is None:
            ended = await iterate(d)
        if ended is not None:
            return ended
