"""``run_loop``: drive the gates, run a typed iteration, fold the result into ``Run``.

The loop never assigns to ``Run``: :meth:`~reel.services.crucible.driver.Driver.commit`
appends events to the session log (one writer, guarded, LSN = stream sequence)
and folds them with the same pure :func:`reel.shared.crucible.fold.apply` that
``resume`` uses, so the live state *is* a re-fold of the log. Every transition,
gate decision, reading and row is an event (see :mod:`reel.shared.crucible.events`).

Per iteration: the gates here (rescope, goal, budget, park; probes in
:mod:`reel.services.crucible.gates`), then :func:`reel.services.crucible.step.iterate`: the
proposer edits the world, then ``Iteration[Proposed] → apply → Iteration[Applied]
→ measure → Iteration[Measured] → decide → Decided`` (:mod:`reel.services.crucible.decide`);
a keep leaves the world at the new best, anything else rolls it back to the best
snapshot. Every break site that ends the run commits its ``SessionEnded`` in the
same commit as its cause.

The modules, by job: :mod:`~reel.services.crucible.driver` (the threaded state and its
commit), :mod:`~reel.services.crucible.baseline` (opening a segment),
:mod:`~reel.services.crucible.step` (propose, gate the candidate, apply),
:mod:`~reel.services.crucible.decide` (measure, keep or discard),
:mod:`~reel.services.crucible.closing` (rows, closing an iteration, ending the run).
"""

from __future__ import annotations

import time

import structlog

from reel.services.crucible import gates
from reel.services.crucible.baseline import open_segment
from reel.services.crucible.driver import Driver, ms_since, now_ms
from reel.services.crucible.step import iterate
from reel.shared.crucible import budget
from reel.shared.crucible.events import Escalated, ParkEnded, ParkStarted
from reel.shared.crucible.noise import goal_met
from reel.shared.crucible.state import LoopExit

log = structlog.get_logger("reel.crucible")


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
    due = budget.exhausted(d.run, d.cfg.budget, d.cfg.proposer.max_cost_usd)
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
                ended = ParkEnded(it=it, parked_ms=ms_since(t0), at_ms=now_ms())
                return await d.end(LoopExit.STOPPED, "stop requested while parked", ended)
            got = await gates.probe(spec, d.world.root)
        await d.commit(ParkEnded(it=it, parked_ms=ms_since(t0), at_ms=now_ms()))
    if isinstance(got, gates.Broken):
        return await d.end(LoopExit.ESCALATED, got.reason, Escalated(it=it, reason=got.reason, at_ms=now_ms()))
    return None


async def run_loop(d: Driver) -> LoopExit:
    """Drive gates, then a typed iteration, folding each result into ``Run``, until a ``LoopExit``."""
    structlog.contextvars.bind_contextvars(session_id=d.session_id)
    while True:
        ended = await run_gates(d)
        if ended is None:
            ended = await iterate(d)
        if ended is not None:
            return ended
