"""``Iteration[Applied] → measure → Iteration[Measured] → decide``: the judge's readings and the keep/discard.

Every measurement runs in the session's measure tree, a clean checkout of the
measured sha (never the world: nothing the judge writes enters a candidate); the
fingerprint is checked there before each one (no moved goalposts), and an
unavailable judge is waited out (parked time, not a discard). A would-be keep is
confirmed before it is kept (``noise.confirm_repeats`` more readings of the
candidate and, with ``noise.remeasure_incumbent``, as many of the best snapshot,
alternately; each incumbent reading corrects the best score in the fold). A keep
leaves the world at the new best; anything else rolls it back to the best snapshot.
"""

from __future__ import annotations

from pathlib import Path

import structlog
from msgspec.structs import replace

from reel.services.crucible.closing import Tally, cleared, close, close_and_end, wait_block
from reel.services.crucible.driver import Driver, now_ms
from reel.services.crucible.judge import Unavailable
from reel.shared.crucible import budget
from reel.shared.crucible.events import (
    FingerprintChanged,
    IterationClosed,
    MeasureFinished,
    MeasureStarted,
    MeasureTarget,
    ProvisioningBlocked,
)
from reel.shared.crucible.iteration import Applied, Iteration, combined
from reel.shared.crucible.state import Fate, InvalidReading, LoopExit, Measurement, Reading, WorldSha

log = structlog.get_logger("reel.crucible")


async def measure_and_decide(d: Driver, tally: Tally, applied: Iteration[Applied]) -> LoopExit | None:
    """Measure the applied candidate, confirm a would-be keep, decide, and close the iteration with its row."""
    first = await measure(d, tally, applied, applied.state.sha, "candidate")
    if isinstance(first, LoopExit):
        return first
    measured = applied.measure(first)
    regime, noise = d.regime(), d.cfg.noise
    incumbent: Reading | None = None
    confirmation: Measurement | None = None
    if measured.promotes(segment=d.run.segment, direction=regime.judge.direction, noise=noise):
        got = await _confirm(d, tally, applied)
        if isinstance(got, LoopExit):
            return got
        incumbent, confirmation = got
    decided = measured.decide(segment=d.run.segment, direction=regime.judge.direction, noise=noise,
                              goal=regime.goal, wall_ms=tally.wall_ms, incumbent=incumbent,
                              confirmation=confirmation)
    if decided.verdict is not Fate.KEEP:
        await d.best()
    await close(d, replace(decided.row, cost_usd=tally.cost_usd))  # the judge's calls are billed too
    return None


async def _confirm(d: Driver, tally: Tally, applied: Iteration[Applied]
                   ) -> tuple[Reading | None, Measurement | None] | LoopExit:
    """The confirmation of a would-be keep: (fresh incumbent readings, the candidate's confirmation).

    Incumbent and candidate are measured alternately (a drifting judge moves both
    alike); an invalid candidate reading ends the confirmation (the iteration is invalid).
    """
    noise = d.cfg.noise
    rounds_c = noise.confirm_repeats
    rounds_i = max(rounds_c, 1) if noise.remeasure_incumbent else 0
    inc: Reading | None = None
    conf: Measurement | None = None
    for k in range(max(rounds_c, rounds_i)):
        if k < rounds_i:
            got = await measure(d, tally, applied, d.run.segment.best_snap, "incumbent")
            if isinstance(got, LoopExit):
                return got
            if isinstance(got, Reading):
                inc = got if inc is None else combined(inc, got)
        if k < rounds_c:
            got = await measure(d, tally, applied, applied.state.sha, "candidate")
            if isinstance(got, LoopExit):
                return got
            if isinstance(got, InvalidReading):
                values = conf.values if isinstance(conf, Reading) else ()
                return inc, InvalidReading(reason=got.reason, values=(*values, *got.values), judge_ms=got.judge_ms,
                                           cost_usd=got.cost_usd)
            conf = got if conf is None or isinstance(conf, InvalidReading) else combined(conf, got)
    return inc, conf


async def _fingerprint_ok(d: Driver, tally: Tally, applied: Iteration[Applied], tree_sha: WorldSha,
                          ) -> tuple[str, Path] | LoopExit:
    """The measure tree at ``tree_sha`` and the judge's fingerprint there if it still matches the
    segment's; else stop the run (no moved goalposts)."""
    tree = await d.world.measure_tree(tree_sha)
    fp = await d.judge(d.regime()).fingerprint(tree)
    expected = d.run.segment.fingerprint
    if fp.digest == expected:
        return fp.digest, tree
    await d.best()
    changed = fp.changed(d.fingerprint_parts) if d.fingerprint_parts else ()
    why = f"judge fingerprint changed ({', '.join(changed) or 'digest'}); not measuring against a moved goalpost"
    row = replace(applied.abandon(best_score=d.run.segment.best_score, reason=why, wall_ms=tally.wall_ms),
                  cost_usd=tally.cost_usd)
    return await d.end(LoopExit.STOPPED, why,
                       FingerprintChanged(it=tally.it, expected=expected, actual=fp.digest, changed=changed,
                                          at_ms=now_ms()),
                       IterationClosed(row=row, at_ms=now_ms()))


async def measure(d: Driver, tally: Tally, applied: Iteration[Applied], sha: WorldSha,
                  target: MeasureTarget) -> Measurement | LoopExit:
    """One measurement of ``sha`` (the candidate or the incumbent) in a clean measure tree: check the
    fingerprint there, run the judge, wait out an unavailable judge (parked, not a discard)."""
    regime = d.regime()
    while True:
        checked = await _fingerprint_ok(d, tally, applied, sha)
        if isinstance(checked, LoopExit):
            return checked
        digest, tree = checked
        await d.commit(MeasureStarted(it=tally.it, target=target, fingerprint=digest, at_ms=now_ms()))
        got = await d.judge(regime).measure(regime.judge.repeats, tree, d.tag(regime.name, tally.it, target, sha))
        if isinstance(got, Unavailable):
            tally.cost_usd += got.cost_usd
            await d.commit(ProvisioningBlocked(it=tally.it, resource="judge", reason=got.reason,
                                               cost_usd=got.cost_usd, at_ms=now_ms()))
            log.info("crucible.blocked", resource="judge", reason=got.reason)
            waited = await wait_block(d, tally)
            if waited is not None:
                return waited
            why = budget.judge_retry_exhausted(d.run, d.cfg.budget, got.cost_usd)
            if why is not None:
                await d.best()
                return await close_and_end(d, tally, LoopExit.BUDGET, Fate.ABANDONED,
                                           f"{why} (the judge was unavailable: {got.reason})")
            continue
        await cleared(d, tally, "judge")
        tally.cost_usd += got.cost_usd
        await d.commit(MeasureFinished(it=tally.it, target=target, reading=got, at_ms=now_ms()))
        return got
