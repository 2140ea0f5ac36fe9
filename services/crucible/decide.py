"""``Iteration[Applied] → measure → Iteration[Measured] → decide``: the judge's reading and the keep/discard.

The fingerprint is checked before every measurement (no moved goalposts), an
unavailable judge is waited out (not a discard), the incumbent is re-measured
before a promotion when ``noise.remeasure_incumbent`` asks, and a keep leaves the
world at the new best while anything else rolls it back to the best snapshot.
"""

from __future__ import annotations

import structlog

from services.crucible.closing import Tally, cleared, close, wait_block
from services.crucible.driver import Driver, now_ms
from services.crucible.judge import Unavailable
from shared.crucible.events import (
    FingerprintChanged,
    IterationClosed,
    MeasureFinished,
    MeasureStarted,
    ProvisioningBlocked,
)
from shared.crucible.iteration import Applied, Iteration, Measured
from shared.crucible.state import Fate, InvalidReading, LoopExit, Reading

log = structlog.get_logger("reel.crucible")


async def measure_and_decide(d: Driver, tally: Tally, applied: Iteration[Applied]) -> LoopExit | None:
    """Measure the applied candidate, decide keep or discard, and close the iteration with its row."""
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
    await close(d, decided.row)
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
            waited = await wait_block(d, tally)
            if waited is not None:
                return waited
            continue
        await cleared(d, tally, "judge")
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
