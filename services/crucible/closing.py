"""How an iteration ends: its tally, its row, the ``IterationClosed`` commit, and ending the run with it.

Also the provisioning-block wait shared by a blocked proposer and an unavailable
judge: wait ``gates.retry_s``, or close the iteration and end the run when the
block outlasts ``gates.max_block_s`` or a stop is requested.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import structlog

from reel.services.crucible import gates
from reel.services.crucible.driver import Driver, ms_since, now_ms
from reel.shared.crucible.events import AnySessionEvent, Escalated, IterationClosed, ProvisioningCleared
from reel.shared.crucible.iteration import gate_row
from reel.shared.crucible.state import Fate, LoopExit, Row

log = structlog.get_logger("reel.crucible")


@dataclass
class Tally:
    """What one iteration has cost so far: proposer and judge calls (USD), its start (perf counter), and
    the time waited out in the block in force (ms, parked: committed with its ``ProvisioningCleared``)."""

    it: int
    t0: float = field(default_factory=time.perf_counter)
    cost_usd: float = 0.0
    waited_ms: int = 0

    @property
    def wall_ms(self) -> int:
        return ms_since(self.t0)


def row(d: Driver, tally: Tally, verdict: Fate, reason: str, note: str = "", diffstat: str = "") -> Row:
    """The row of an iteration closed by a gate (no reading): ``verdict`` for ``reason``, at the segment's best."""
    return gate_row(it=tally.it, regime=d.run.segment.regime, verdict=verdict, best_score=d.run.segment.best_score,
                    reason=reason, note=note, diffstat=diffstat, cost_usd=tally.cost_usd, wall_ms=tally.wall_ms)


async def close(d: Driver, row: Row, *before: AnySessionEvent) -> None:
    """Commit ``before`` and the iteration's ``IterationClosed`` together; the run goes on."""
    await d.commit(*before, IterationClosed(row=row, at_ms=now_ms()))
    log.info("crucible.iteration", verdict=row.verdict.value, score=row.score, delta=row.delta,
             best=row.best_score, sha=(row.sha or "")[:12], reason=row.reason, wall_ms=row.wall_ms)


async def close_and_end(d: Driver, tally: Tally, exit_: LoopExit, verdict: Fate, reason: str,
                        *extra: AnySessionEvent) -> LoopExit:
    """Close the iteration (clearing a pending block: its waits are parked time) and end the run in one commit."""
    cleared: tuple[AnySessionEvent, ...] = ()
    if d.run.pending_block is not None:
        b = d.run.pending_block
        cleared = (ProvisioningCleared(it=tally.it, resource=b.resource, waited_ms=tally.waited_ms, at_ms=now_ms()),)
    closed = row(d, tally, verdict, reason)
    return await d.end(exit_, reason, *cleared, *extra, IterationClosed(row=closed, at_ms=now_ms()))


async def wait_block(d: Driver, tally: Tally) -> LoopExit | None:
    """Wait ``retry_s`` while the iteration is blocked; an exit if stopped or blocked too long."""
    block = d.run.pending_block
    assert block is not None
    blocked_ms = now_ms() - block.since_ms
    if blocked_ms > d.cfg.gates.max_block_s * 1000:
        why = (f"{block.resource} unavailable for {blocked_ms / 1000:.1f}s (> {d.cfg.gates.max_block_s:g}s): "
               f"{block.reason}")
        await d.best()
        return await close_and_end(d, tally, LoopExit.ESCALATED, Fate.ESCALATED, why,
                                   Escalated(it=tally.it, reason=why, at_ms=now_ms()))
    t0 = time.perf_counter()
    stopped = await gates.wait(d.stop, d.cfg.gates.retry_s)
    tally.waited_ms += ms_since(t0)
    if stopped:
        await d.best()
        return await close_and_end(d, tally, LoopExit.STOPPED, Fate.ABANDONED,
                                   f"stop requested while {block.resource} was unavailable")
    return None


async def cleared(d: Driver, tally: Tally, resource: str) -> None:
    """Commit the end of the iteration's pending block on ``resource``, if there is one: its waits,
    parked time (excluded from the time budget, like the park gate's)."""
    block = d.run.pending_block
    if block is not None:
        await d.commit(ProvisioningCleared(it=tally.it, resource=resource, waited_ms=tally.waited_ms,
                                           at_ms=now_ms()))
        tally.waited_ms = 0
