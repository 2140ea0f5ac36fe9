"""One iteration: propose (waiting out a blocked proposer), gate the candidate, apply it, then measure and decide.

``Iteration[Proposed] → apply → Iteration[Applied]`` here, the rest in
:mod:`reel.services.crucible.decide`. The candidate is the best snapshot vs the world
after the proposer — commits it made itself included (:meth:`GitWorld.settle` takes
them off the branch, keeps them under the iteration's proposer ref, and leaves their
change in the working tree). A proposal that is not an edit (failed, escalate, done,
rescope), an empty diff, a denied path or a failed apply closes the iteration with a
gate row; the world is rolled back to the best snapshot exactly first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import structlog

from reel.services.crucible import gates
from reel.services.crucible.closing import Tally, cleared, close, close_and_end, row, wait_block
from reel.services.crucible.decide import measure_and_decide
from reel.services.crucible.driver import Driver, now_ms
from reel.services.crucible.proposer import Proposal, ProposeContext
from reel.shared.core.errors import ReelError
from reel.shared.core.run.events import BlobRef
from reel.shared.crucible import budget
from reel.shared.crucible.events import (
    ApplyFailed,
    CandidateApplied,
    CandidateDenied,
    Escalated,
    IterationClosed,
    ProposalMade,
    ProposalOutcome,
    ProvisioningBlocked,
)
from reel.shared.crucible.iteration import CandidateChange, Iteration
from reel.shared.crucible.state import Fate, LoopExit


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
                             best_score=d.run.segment.best_score, rows=d.run.rows, world=d.world,
                             budget=budget.left(d.run, d.cfg.budget))
        proposal = await d.proposer.propose(ctx)
        tally.cost_usd += proposal.cost_usd
        committed = await d.world.settle(tally.it, d.run.segment.best_snap)
        if proposal.kind != "blocked":
            await cleared(d, tally, "proposer")
            return replace(proposal, proposer_sha=committed)
        await d.best()  # drop any partial edit before waiting
        await d.commit(ProvisioningBlocked(it=tally.it, resource="proposer", reason=proposal.detail,
                                           cost_usd=proposal.cost_usd, at_ms=now_ms()))
        waited = await wait_block(d, tally)
        if waited is not None:
            return waited
        why = budget.retry_exhausted(d.run, d.cfg.budget, proposal.cost_usd, d.cfg.proposer.max_cost_usd)
        if why is not None:
            return await close_and_end(d, tally, LoopExit.BUDGET, Fate.ABANDONED,
                                       f"{why} (the proposer was blocked: {proposal.detail})")


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
                            proposer_sha=p.proposer_sha, at_ms=now_ms())


async def _after_proposal(d: Driver, tally: Tally, p: Proposal) -> LoopExit | None:
    made = _Made(tally.it, p, await d.blobs.put(p.prompt.encode()) if p.prompt else None)
    if p.kind == "edited":
        return await _candidate(d, tally, p, made)
    await d.best()
    if p.kind == "failed":
        await close(d, row(d, tally, Fate.FAILED, p.detail, p.note), made("failed", detail=p.detail))
        return None
    if p.kind == "escalate":
        await d.commit(made("escalate", detail=p.detail))
        why = f"proposer escalated: {p.detail}"
        return await close_and_end(d, tally, LoopExit.ESCALATED, Fate.ESCALATED, why,
                                   Escalated(it=tally.it, reason=why, at_ms=now_ms()))
    if p.kind == "done":
        await d.commit(made("done", detail=p.detail))
        why = "proposer has nothing more to propose" + (f": {p.detail}" if p.detail else "")
        return await close_and_end(d, tally, LoopExit.FINISHED, Fate.SKIP, why)
    assert p.kind == "rescope"
    if p.detail not in {r.name for r in d.cfg.regimes}:
        why = f"rescope to unknown regime {p.detail!r}"
        await close(d, row(d, tally, Fate.FAILED, why, p.note), made("failed", detail=why))
        return None
    await close(d, row(d, tally, Fate.SKIP, f"rescope to {p.detail} requested", p.note),
                made("rescope", detail=p.detail))
    return None


async def _candidate(d: Driver, tally: Tally, p: Proposal, made: _Made) -> LoopExit | None:
    staged = await d.world.stage()
    if staged.empty:
        await close(d, row(d, tally, Fate.SKIP, "empty diff: nothing to measure", p.note), made("empty"))
        return None
    patch = await d.blobs.put(staged.patch, "text/x-diff")
    await d.commit(made("candidate", paths=staged.paths, diffstat=staged.diffstat, patch=patch))
    bad = gates.denied(staged.paths, d.state.started.protected)
    if bad:
        await d.best()
        why = f"candidate touches protected paths: {', '.join(bad)}"
        denied_row = row(d, tally, Fate.DENIED, why, p.note, staged.diffstat)
        denial = CandidateDenied(it=tally.it, paths=bad, reason=why, at_ms=now_ms())
        if d.cfg.gates.on_deny == "escalate":
            return await d.end(LoopExit.ESCALATED, why, denial, IterationClosed(row=denied_row, at_ms=now_ms()),
                               Escalated(it=tally.it, reason=why, at_ms=now_ms()))
        await close(d, denied_row, denial)
        return None
    proposed = Iteration.propose(tally.it, d.run.segment.regime,
                                 CandidateChange(note=p.note, paths=staged.paths, diffstat=staged.diffstat,
                                                 cost_usd=tally.cost_usd))
    try:
        sha = await d.world.apply(tally.it, p.note)
    except ReelError as exc:
        await d.best()
        await close(d, row(d, tally, Fate.FAILED, exc.message, p.note, staged.diffstat),
                    ApplyFailed(it=tally.it, error=exc.message, at_ms=now_ms()))
        return None
    applied = proposed.apply(sha)
    await d.commit(CandidateApplied(it=tally.it, sha=sha, at_ms=now_ms()))
    return await measure_and_decide(d, tally, applied)
