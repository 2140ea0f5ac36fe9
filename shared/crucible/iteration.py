"""The typed iteration protocol: ``Iteration[Proposed] → Iteration[Applied] → Iteration[Measured]``.

Only the linear sub-protocol is typestate ("type the protocol, not the process").
Each transition is a method whose ``self`` type names the one state it may be
called from, so mypy rejects illegal orderings:

* ``measure`` exists only on ``Iteration[Applied]`` — measuring before apply does not type-check;
* ``decide`` exists only on ``Iteration[Measured]`` — deciding (keeping) without a reading does not type-check;
* ``apply`` exists only on ``Iteration[Proposed]``.

The transitions are pure: the shell performs the side effect (commit the
candidate, run the judge) and hands the result to the transition, so a
``Iteration[Applied]`` can only be obtained with a snapshot in hand and a
``Iteration[Measured]`` only with a measurement in hand. ``decide`` returns
:class:`Decided` ``{row, verdict, reading}``: the
keep path needs the reading's score, so it is handed back by construction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Generic, TypeVar, final

import msgspec
from msgspec.structs import replace

from reel.shared.crucible.config import Direction, NoiseSpec
from reel.shared.crucible.noise import goal_met, improvement, margin
from reel.shared.crucible.state import (
    Fate,
    InvalidReading,
    Measurement,
    Reading,
    Row,
    Run,
    Segment,
    WorldSha,
    estimate,
)


class CandidateChange(msgspec.Struct, frozen=True, kw_only=True):
    """A change the proposer staged in the world.

    Attributes:
        note: the proposer's one-line description.
        paths: world paths the change touches (sorted).
        diffstat: ``git diff --stat`` summary line(s).
        cost_usd: what proposing it cost (all calls of this iteration, failed ones too).
    """

    note: str
    paths: tuple[str, ...]
    diffstat: str = ""
    cost_usd: float = 0.0


@final
class Proposed(msgspec.Struct, frozen=True, kw_only=True):
    """State: the candidate is staged in the world and passed the gates."""

    candidate: CandidateChange


@final
class Applied(msgspec.Struct, frozen=True, kw_only=True):
    """State: the world committed the candidate (``sha`` is its snapshot)."""

    candidate: CandidateChange
    sha: WorldSha


@final
class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """State: the frozen judge measured the applied candidate."""

    candidate: CandidateChange
    sha: WorldSha
    reading: Measurement


S = TypeVar("S", Proposed, Applied, Measured)


class Decided(msgspec.Struct, frozen=True, kw_only=True):
    """The result of :meth:`Iteration.decide`: the row, its verdict, and the reading it rests on."""

    row: Row
    verdict: Fate
    reading: Measurement

    @property
    def kept(self) -> Reading | None:
        """The valid reading that made this a keep, else ``None``."""
        return self.reading if self.verdict is Fate.KEEP and isinstance(self.reading, Reading) else None


@final
class Iteration(Generic[S]):
    """One iteration ``it`` of regime ``regime`` in state ``S`` (immutable; transitions return a new one)."""

    __slots__ = ("it", "regime", "state")
    it: int
    regime: str
    state: S

    def __init__(self, it: int, regime: str, state: S) -> None:
        object.__setattr__(self, "it", it)
        object.__setattr__(self, "regime", regime)
        object.__setattr__(self, "state", state)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Iteration is immutable; transitions return a new one")

    def __repr__(self) -> str:
        return f"Iteration[{type(self.state).__name__}](it={self.it}, regime={self.regime!r})"

    @staticmethod
    def propose(it: int, regime: str, candidate: CandidateChange) -> Iteration[Proposed]:
        """Enter the protocol: a candidate that passed the gates."""
        return Iteration(it, regime, Proposed(candidate=candidate))

    def apply(self: Iteration[Proposed], sha: WorldSha) -> Iteration[Applied]:
        """Proposed → Applied, with the snapshot the world's commit produced."""
        return Iteration(self.it, self.regime, Applied(candidate=self.state.candidate, sha=sha))

    def measure(self: Iteration[Applied], reading: Measurement) -> Iteration[Measured]:
        """Applied → Measured, with the judge's measurement of that snapshot."""
        s = self.state
        return Iteration(self.it, self.regime, Measured(candidate=s.candidate, sha=s.sha, reading=reading))

    def abandon(self: Iteration[Applied], *, best_score: float, reason: str, wall_ms: int) -> Row:
        """The row of an applied candidate that will never be measured (e.g. the judge's fingerprint moved)."""
        s = self.state
        return Row(it=self.it, regime=self.regime, verdict=Fate.ABANDONED, best_score=best_score, sha=s.sha,
                   note=s.candidate.note, diffstat=s.candidate.diffstat, cost_usd=s.candidate.cost_usd,
                   wall_ms=wall_ms, reason=reason)

    def promotes(self: Iteration[Measured], *, segment: Segment, direction: Direction, noise: NoiseSpec) -> bool:
        """Whether this first reading would be kept (a valid one past the margin against the best's readings).

        The shell asks this before spending confirmation measurements (``noise.confirm_repeats``,
        ``noise.remeasure_incumbent``): only a would-be keep is confirmed.
        """
        reading = self.state.reading
        if not isinstance(reading, Reading):
            return False
        gain, need = keep_test(reading.values, best_values(segment), segment=segment, direction=direction,
                               noise=noise)
        return gain > need

    def decide(self: Iteration[Measured], *, segment: Segment, direction: Direction, noise: NoiseSpec,
               goal: float | None, wall_ms: int, incumbent: Reading | None = None,
               confirmation: Measurement | None = None) -> Decided:
        """Keep or discard: only valid readings better than the best by more than the margin are kept.

        Args:
            segment: the current segment: the best snapshot's readings (corrected by any
                re-measurement of it, see :meth:`Segment.remeasured`) and the baseline's (σ).
            incumbent: the fresh readings of the best snapshot taken while confirming (for the row).
            confirmation: the candidate's confirmation readings; an invalid one makes the
                iteration invalid (never a keep).
            wall_ms: the iteration's wall time so far (ms), for the row.

        The kept path's :attr:`Decided.reading` is every valid value of the candidate
        (first reading and confirmations), its score their mean: the new best score.
        """
        s = self.state
        c, best = s.candidate, segment.best_score
        base = Row(it=self.it, regime=self.regime, verdict=Fate.INVALID, best_score=best, sha=s.sha,
                   note=c.note, diffstat=c.diffstat, cost_usd=c.cost_usd, wall_ms=wall_ms,
                   incumbent=incumbent.values if incumbent is not None else ())
        first: Measurement = s.reading
        if isinstance(first, InvalidReading):
            row = replace(base, readings=(*first.values, None), reason=first.reason)
            return Decided(row=row, verdict=Fate.INVALID, reading=first)
        if isinstance(confirmation, InvalidReading):
            bad: InvalidReading = confirmation
            row = replace(base, readings=(*first.values, *bad.values, None), reason=f"confirmation: {bad.reason}")
            return Decided(row=row, verdict=Fate.INVALID, reading=bad)
        reading = first if confirmation is None else combined(first, confirmation)
        ref = best_values(segment)
        selecting = len(first.values) if confirmation is not None else 0
        # "all" counts the selecting reading too (it must beat the best as well: stricter); "mean" leaves it out
        judged = reading.values if noise.confirm_rule == "all" else reading.values[selecting:]
        gain, need = keep_test(judged, ref, segment=segment, direction=direction, noise=noise)
        keep = gain > need
        verdict = Fate.KEEP if keep else Fate.DISCARD
        new_best = estimate(reading.values, selecting) if selecting else reading.score
        row = replace(base, verdict=verdict, readings=reading.values, score=reading.score,
                      delta=reading.score - best, best_score=new_best if keep else best,
                      kept_sha=s.sha if keep else None, goal_met=keep and goal_met(direction, new_best, goal),
                      reason="" if keep else discard_reason(judged, ref, gain=gain, need=need,
                                                            direction=direction, noise=noise),
                      selecting=selecting if keep else 0)
        return Decided(row=row, verdict=verdict, reading=reading)


def best_values(segment: Segment) -> tuple[float, ...]:
    """The values the best snapshot is judged by: every value measured on it but the reading that selected
    it, while others exist (:func:`~reel.shared.crucible.state.estimate`); its score alone for a segment
    without values."""
    readings = segment.best_readings or (segment.best_score,)
    return readings[segment.best_selecting:] or readings


def discard_reason(values: Sequence[float], ref: Sequence[float], *, gain: float, need: float,
                   direction: Direction, noise: NoiseSpec) -> str:
    """A discard's reason as a sentence: both figures compared, the margin and the rule that compared them.

    E.g. ``its worst reading 8 is not better than the best's best reading 9 by more than the margin 0
    (rule "all": each of the candidate's 1 reading(s) must beat each of the best's 3; better = lower)``.
    """
    better = "higher" if direction == "maximize" else "lower"
    if noise.confirm_rule == "all":
        worst = min(values) if direction == "maximize" else max(values)
        top = max(ref) if direction == "maximize" else min(ref)
        return (f"its worst reading {worst:.6g} is not better than the best's best reading {top:.6g} by more "
                f"than the margin {need:.6g} (improvement {gain:+.6g}; rule \"all\": each of the candidate's "
                f"{len(values)} reading(s) must beat each of the best's {len(ref)}; better = {better})")
    mine, theirs = math.fsum(values) / len(values), math.fsum(ref) / len(ref)
    return (f"its mean {mine:.6g} is not better than the best's mean {theirs:.6g} by more than the margin "
            f"{need:.6g} (improvement {gain:+.6g}; rule \"mean\": the mean of its {len(values)} reading(s) "
            f"against the mean of the best's {len(ref)}; better = {better})")


def combined(first: Reading, more: Reading) -> Reading:
    """One reading of a candidate from its first reading and its confirmation (values in order)."""
    values = (*first.values, *more.values)
    return Reading(values=values, score=math.fsum(values) / len(values), total=first.total,
                   judge_ms=first.judge_ms + more.judge_ms, cost_usd=first.cost_usd + more.cost_usd)


def keep_test(values: Sequence[float], ref: Sequence[float], *, segment: Segment, direction: Direction,
              noise: NoiseSpec) -> tuple[float, float]:
    """The one keep test's figures: ``(gain, need)``; a candidate is kept iff ``gain > need``.

    Args:
        values: the candidate's values (judge units): its first reading, plus its confirmations.
        ref: every value of the best snapshot (recorded and re-measured).
        segment: supplies the baseline readings the noise margin is computed from.

    Returns:
        ``gain``: under ``noise.confirm_rule`` ``all``, the candidate's worst value's improvement
        over the best snapshot's best value; under ``mean``, the improvement of the candidate's
        mean over the best snapshot's mean (positive = better, in ``direction``);
        ``need``: the noise margin it must exceed (:func:`reel.shared.crucible.noise.margin`).
    """
    ref_mean = math.fsum(ref) / len(ref)
    if noise.confirm_rule == "all":
        pick = (min, max) if direction == "maximize" else (max, min)
        gain = improvement(direction, pick[0](values), pick[1](ref))
    else:
        gain = improvement(direction, math.fsum(values) / len(values), ref_mean)
    return gain, margin(noise, ref_mean, segment.baseline_readings)


def gate_row(*, it: int, regime: str, verdict: Fate, best_score: float, reason: str, note: str = "",
             diffstat: str = "", cost_usd: float = 0.0, wall_ms: int = 0) -> Row:
    """The row of an iteration a gate or the proposer ended before it entered ``Proposed``."""
    return Row(it=it, regime=regime, verdict=verdict, best_score=best_score, note=note, diffstat=diffstat,
               cost_usd=cost_usd, wall_ms=wall_ms, reason=reason)


def interrupted_row(run: Run, reason: str = "interrupted (process died); resumed") -> Row | None:
    """The row of the iteration in flight when the driver died, for ``SessionResumed`` (``None`` if none).

    Resume rolls the world back to the best snapshot, so whatever the iteration
    had reached (proposed, applied, measured) it is abandoned, never kept.
    """
    o = run.open_it
    if o is None:
        return None
    return Row(it=o.it, regime=run.segment.regime, verdict=Fate.ABANDONED, best_score=run.segment.best_score,
               sha=o.sha, note=o.note, cost_usd=o.cost_usd, reason=reason)
