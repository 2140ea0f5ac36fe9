"""Opening a segment: a measured baseline of the best snapshot (the initial baseline and every rescope)."""

from __future__ import annotations

import time
from pathlib import Path

import structlog

from reel.services.crucible import gates
from reel.services.crucible.driver import Driver, ms_since, now_ms
from reel.services.crucible.judge import Judge, Unavailable
from reel.shared.crucible.config import Regime
from reel.shared.crucible.events import Escalated, SegmentOpened, SegmentReason
from reel.shared.crucible.noise import goal_met
from reel.shared.crucible.state import InvalidReading, LoopExit, Measurement

log = structlog.get_logger("reel.crucible")


async def open_segment(d: Driver, regime: Regime, reason: SegmentReason) -> LoopExit | None:
    """Measure a baseline of the current best snapshot under ``regime`` and open its segment.

    The one call behind both the initial baseline and a rescope: the fold assigns
    ``run.segment = Segment.baseline(...)``.
    An invalid baseline escalates (there is no goalpost to measure against).
    """
    t0 = time.perf_counter()
    snap = await d.best()
    tree = await d.world.measure_tree(snap)
    judge = d.judge(regime)
    fp = await judge.fingerprint(tree)
    repeats = max(regime.judge.repeats, d.cfg.noise.baseline_repeats)
    it = d.run.spent.iterations if d.state.run is not None else 0
    got = await _measure_waiting(d, judge, repeats, tree, d.tag(regime.name, it, "baseline", snap))
    if isinstance(got, LoopExit):
        return got
    reading, parked_ms = got
    if isinstance(reading, InvalidReading):
        why = f"baseline of regime {regime.name} is invalid: {reading.reason}"
        return await d.end(LoopExit.ESCALATED, why, Escalated(reason=why, at_ms=now_ms()))
    d.fingerprint_parts = fp.parts
    await d.commit(SegmentOpened(
        regime=regime.name, reason=reason, fingerprint=fp.digest,
        fingerprint_parts=fp.parts, reading=reading, snap=snap,
        goal_met=goal_met(regime.judge.direction, reading.score, regime.goal), wall_ms=ms_since(t0),
        parked_ms=parked_ms, at_ms=now_ms(),
    ))
    log.info("crucible.segment", regime=regime.name, reason=reason, baseline=reading.score, snap=snap[:12])
    return None


async def _measure_waiting(d: Driver, judge: Judge, repeats: int, tree: Path, tag: dict[str, str]
                           ) -> tuple[Measurement, int] | LoopExit:
    """A baseline measurement in ``tree``, waiting out an unavailable judge (up to ``gates.max_block_s``);
    the measurement and the time spent waiting (ms, parked: not counted against the time budget)."""
    t0 = time.perf_counter()
    parked_ms = 0
    while True:
        got = await judge.measure(repeats, tree, tag)
        if not isinstance(got, Unavailable):
            return got, parked_ms
        if ms_since(t0) > d.cfg.gates.max_block_s * 1000:
            why = f"judge unavailable for the baseline longer than {d.cfg.gates.max_block_s:g}s: {got.reason}"
            return await d.end(LoopExit.ESCALATED, why, Escalated(reason=why, at_ms=now_ms()))
        waited = time.perf_counter()
        if await gates.wait(d.stop, d.cfg.gates.retry_s):
            return await d.end(LoopExit.STOPPED, "stop requested while the judge was unavailable")
        parked_ms += ms_since(waited)
