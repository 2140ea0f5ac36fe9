"""A lab's figures from its runs: each run's verdict before and after its fork, pass rates, flips, usage.

A branch's **verdict** is ``pass`` when every verifier it is judged by has its latest verdict on that branch
``pass`` (``fail``, ``error``: ``fail``); the verifiers are the SPEC's ``verifier:`` names, else every verifier
of the run. A branch missing one of them has no verdict (:func:`branch_verdict` says which is missing).

:func:`tally` counts only the runs that were forked and judged on both sides: the *before* and *after* pass
rates are over the same runs (paired), each with Wilson's 95 % interval
(:func:`reel.shared.core.lab.stats.pass_rate`); every other run is listed as skipped with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from reel.shared.core.lab.point import Skip
from reel.shared.core.lab.stats import PassRate, pass_rate
from reel.shared.core.run.compare import BranchFacts

PASS = "pass"
FAIL = "fail"


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens and cost of a branch (every attempt, inherited ones included, as ``reel compare`` counts), or a sum."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(input_tokens=self.input_tokens + other.input_tokens,
                     output_tokens=self.output_tokens + other.output_tokens,
                     cost_usd=round(self.cost_usd + other.cost_usd, 10))


def usage_of(facts: BranchFacts) -> Usage:
    """A branch's usage as its comparison row gives it."""
    return Usage(input_tokens=facts.input_tokens, output_tokens=facts.output_tokens, cost_usd=facts.cost_usd)


def judged_by(spec_verifiers: Sequence[str], run_verifiers: Sequence[str]) -> tuple[str, ...] | Skip:
    """The verifiers a run's verdicts are made of: the SPEC's (each must be the run's), else all the run's."""
    if not spec_verifiers:
        return tuple(run_verifiers) if run_verifiers else Skip("the run has no verifier")
    missing = [v for v in spec_verifiers if v not in run_verifiers]
    if missing:
        return Skip(f"the run has no verifier {missing[0]} (it has {', '.join(run_verifiers) or 'none'})")
    return tuple(spec_verifiers)


def branch_verdict(verdicts: Mapping[str, str], verifiers: Sequence[str]) -> str | Skip:
    """``pass`` / ``fail`` of a branch whose latest verdicts are ``verdicts`` (see the module docstring)."""
    missing = [v for v in verifiers if v not in verdicts]
    if missing:
        return Skip(f"no verdict of {missing[0]}")
    return PASS if all(verdicts[v] == PASS for v in verifiers) else FAIL


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """One run of a lab: forked (``branch_id``, ``at_step``, both verdicts) or skipped (``skipped``: why).

    Attributes:
        source: where the run came from: its recording's file (a replay) or its workflow's name.
        base_branch: the branch forked and judged *before*.
        before, after: the verdicts of ``base_branch`` and of the fork (``None``: none).
        before_usage, after_usage: their tokens and cost.
        wall_s: from the fork command to the fork at rest (seconds).
    """

    run_id: str
    source: str = ""
    base_branch: str | None = None
    branch_id: str | None = None
    at_step: str | None = None
    before: str | None = None
    after: str | None = None
    skipped: str | None = None
    before_usage: Usage = Usage()
    after_usage: Usage = Usage()
    wall_s: float = 0.0


class Flip(msgspec.Struct, frozen=True, kw_only=True):
    """A run whose verdict changed: the run, the fork's branch and the turn it re-ran."""

    run_id: str
    branch_id: str
    at_step: str


class Skipped(msgspec.Struct, frozen=True, kw_only=True):
    """A run left out of the rates, and why."""

    run_id: str
    source: str
    reason: str


class LabReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a lab found (see the module docstring); ``runs`` the runs it considered, ``counted`` those in the
    rates."""

    name: str
    point: str
    edit: str
    verifiers: tuple[str, ...]
    runs: int
    counted: int
    before: PassRate
    after: PassRate
    pass_to_fail: tuple[Flip, ...]
    fail_to_pass: tuple[Flip, ...]
    skipped: tuple[Skipped, ...]
    before_usage: Usage
    after_usage: Usage
    wall_s: float = 0.0
    results: tuple[RunResult, ...] = ()


def counted(r: RunResult) -> bool:
    """Whether the run counts in the rates: forked, with a verdict before and after."""
    return r.skipped is None and r.branch_id is not None and r.before is not None and r.after is not None


def tally(results: Sequence[RunResult], *, name: str, point: str, edit: str, verifiers: Sequence[str],
          wall_s: float = 0.0) -> LabReport:
    """The lab's report over ``results`` (see the module docstring); ``point``, ``edit``: as the SPEC says them."""
    ok = [r for r in results if counted(r)]
    flips = [(r.before, r.after, Flip(run_id=r.run_id, branch_id=r.branch_id or "", at_step=r.at_step or ""))
             for r in ok if r.before != r.after]
    skipped = tuple(Skipped(run_id=r.run_id, source=r.source, reason=r.skipped or _why_not(r))
                    for r in results if not counted(r))
    return LabReport(
        name=name, point=point, edit=edit, verifiers=tuple(verifiers), runs=len(results), counted=len(ok),
        before=pass_rate(sum(r.before == PASS for r in ok), len(ok)),
        after=pass_rate(sum(r.after == PASS for r in ok), len(ok)),
        pass_to_fail=tuple(f for b, _, f in flips if b == PASS),
        fail_to_pass=tuple(f for b, _, f in flips if b == FAIL),
        skipped=skipped, before_usage=sum((r.before_usage for r in ok), Usage()),
        after_usage=sum((r.after_usage for r in ok), Usage()), wall_s=round(wall_s, 3), results=tuple(results))


def _why_not(r: RunResult) -> str:
    if r.branch_id is None:
        return "not forked"
    return "no verdict before the fork" if r.before is None else "no verdict after the fork"
