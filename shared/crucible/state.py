"""The loop's state model: ``Run`` with its ``Segment``, readings, rows, ``LoopExit``.

Pure values: every struct is frozen. The loop never mutates a ``Run``; it commits
events and folds them (:mod:`reel.shared.crucible.fold`), so the live state and a
cold re-fold of the session log are the same thing by construction.

* :class:`Segment` — everything a re-scope replaces at once (scores are compared only within one
  regime and judge fingerprint). Opening a segment is one call, :meth:`Segment.baseline`, which owns
  the fingerprint; a rescope is one assignment of its result.
* :class:`LoopExit` — the one place that enumerates how a run ends, mapped to an
  :class:`SessionOutcome` and to the process exit code. ``ESCALATED`` is a
  unit variant: the escalation is reported and the world rolled back at the break
  site (Implementation notes).
"""

from __future__ import annotations

import enum
import math
from datetime import timedelta
from typing import NewType

import msgspec

WorldSha = NewType("WorldSha", str)
"""The world's opaque snapshot handle (a git commit sha).

Not a run-state snapshot (:mod:`reel.shared.nats.snapshots`): this names a state of the crucible's world.
"""


class Reading(msgspec.Struct, frozen=True, kw_only=True, tag="valid", tag_field="kind"):
    """A valid measurement: every repeat printed a finite score.

    Attributes:
        values: each repeat's score, in run order.
        score: their mean (the value compared against the best).
        total: the size of the judge's universe if it reports one (e.g. cases), else ``None``.
        judge_ms: wall time of all repeats (ms).
        cost_usd: what the repeats reported costing (USD; counted against the budget).
    """

    values: tuple[float, ...]
    score: float
    total: int | None = None
    judge_ms: int = 0
    cost_usd: float = 0.0


class InvalidReading(msgspec.Struct, frozen=True, kw_only=True, tag="invalid", tag_field="kind"):
    """A crash, a timeout, NaN/inf or a missing value: never a score, never a keep.

    Attributes:
        reason: one line, e.g. ``"crash: exit 1: ZeroDivisionError"``, ``"timeout after 5.0s"``, ``"nan"``.
        values: the finite scores of the repeats that did print one.
        judge_ms: wall time of all repeats (ms).
        cost_usd: what the repeats reported costing, the failed one included (USD).
    """

    reason: str
    values: tuple[float, ...] = ()
    judge_ms: int = 0
    cost_usd: float = 0.0


Measurement = Reading | InvalidReading


class Fate(enum.StrEnum):
    """What became of one iteration (one row each; the row's ``verdict`` field on the wire).

    Not a verifier's run-event ``Verdict`` (:class:`reel.shared.core.run.events.Verdict`).
    """

    KEEP = "keep"  # measured better by more than the margin: the new best snapshot
    DISCARD = "discard"  # measured, not better enough: rolled back
    INVALID = "invalid"  # the reading was invalid: rolled back, never kept
    SKIP = "skip"  # nothing to measure (empty diff, proposer finished, rescope requested)
    DENIED = "denied"  # the change touched protected paths: refused before apply
    FAILED = "failed"  # the proposer or the apply failed: rolled back
    ESCALATED = "escalated"  # the proposer asked for a human
    ABANDONED = "abandoned"  # interrupted (kill, fingerprint change): rolled back, never measured


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One iteration's record, as ``reel crucible show`` prints it.

    Attributes:
        it: iteration number (1-based, per session).
        regime: the segment's regime when it ran.
        verdict: see :class:`Fate`.
        readings: every repeat's score (``None`` for a repeat without a valid value).
        score: the reading's score (``None`` unless valid).
        delta: ``score - best`` before the decision, in judge units (sign as printed).
        best_score: the segment's best after this row.
        sha: the candidate's snapshot, if it was applied.
        kept_sha: ``sha`` if kept.
        incumbent: fresh readings of the best snapshot, if re-measured before promotion.
        goal_met: the kept score reached the regime's goal.
        note, diffstat: the proposer's note and ``git diff --stat`` of the candidate.
        cost_usd: what the proposer calls of this iteration cost, failed ones included.
        wall_ms: wall time of the iteration (proposer, apply, judge, waits) (ms).
        reason: why (for every verdict but keep/discard), one line.
        selecting: how many leading values of ``readings`` are the first reading that selected the
            candidate for confirmation (0: none is set apart — rows from before this field, or a keep
            without confirmations). A kept snapshot's estimate leaves them out (:func:`estimate`).
    """

    it: int
    regime: str
    verdict: Fate
    readings: tuple[float | None, ...] = ()
    score: float | None = None
    delta: float | None = None
    best_score: float
    sha: str | None = None
    kept_sha: str | None = None
    incumbent: tuple[float, ...] = ()
    goal_met: bool = False
    note: str = ""
    diffstat: str = ""
    cost_usd: float = 0.0
    wall_ms: int = 0
    reason: str = ""
    selecting: int = 0


def estimate(readings: tuple[float, ...], selecting: int) -> float:
    """A snapshot's score from its readings, leaving out the ``selecting`` leading ones that selected it.

    A reading that made a candidate look better than the best is biased upward by the selection
    (the winner's curse): a lucky one is what gets confirmed. So once other readings of the snapshot
    exist (confirmations, re-measurements), its score is their mean alone; with none, the mean of all.
    """
    rest = readings[selecting:]
    use = rest or readings
    return math.fsum(use) / len(use)


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a re-scope replaces atomically.

    Attributes:
        regime: the regime's name (its judge and goal are in the config).
        fingerprint: the judge's frozen fingerprint at baseline (sha256 hex).
        baseline_score: the score of the segment's first snapshot.
        best_score: the best snapshot's score: the mean of ``best_readings`` (corrected
            whenever the best snapshot is re-measured).
        baseline_total: the judge's universe size at baseline (0 if it reports none).
        best_snap: the snapshot holding ``best_score``.
        baseline_readings: the baseline's repeated values (σ for the k·σ margin).
        best_readings: every value measured on ``best_snap`` so far (the reading that made
            it the best, its confirmations and every re-measurement of the incumbent).
        best_selecting: how many leading values of ``best_readings`` are the reading that selected
            ``best_snap``; ``best_score`` and the keep test leave them out (:func:`estimate`).
    """

    regime: str
    fingerprint: str
    baseline_score: float
    best_score: float
    baseline_total: int
    best_snap: WorldSha
    baseline_readings: tuple[float, ...] = ()
    best_readings: tuple[float, ...] = ()
    best_selecting: int = 0

    @classmethod
    def baseline(cls, *, regime: str, fingerprint: str, reading: Reading, snap: WorldSha) -> Segment:
        """Open a segment from a baseline measurement of ``snap``.

        The shell measures (the judge's fingerprint and a valid reading of the
        world at ``snap``); this builds every field from them in one value.
        """
        return cls(regime=regime, fingerprint=fingerprint, baseline_score=reading.score,
                   best_score=reading.score, baseline_total=reading.total or 0, best_snap=snap,
                   baseline_readings=reading.values, best_readings=reading.values)

    def promoted(self, score: float, snap: WorldSha, readings: tuple[float, ...] = (), selecting: int = 0) -> Segment:
        """The segment after a keep: best score, best snapshot and its readings move together.

        ``selecting``: the leading readings that selected ``snap`` (left out of its estimate,
        :func:`estimate`); with ``readings`` empty the best is ``score`` alone.
        """
        if not readings or not 0 < selecting < len(readings):
            return msgspec.structs.replace(self, best_score=score, best_snap=snap, best_readings=readings or (score,),
                                           best_selecting=0)
        return msgspec.structs.replace(self, best_score=estimate(readings, selecting), best_snap=snap,
                                       best_readings=readings, best_selecting=selecting)

    def remeasured(self, values: tuple[float, ...]) -> Segment:
        """The segment after the best snapshot was measured again: ``best_score`` corrected to the
        mean of every value it has had (a lucky reading does not crown a snapshot for good)."""
        readings = (*(self.best_readings or (self.best_score,)), *values)
        return msgspec.structs.replace(self, best_readings=readings,
                                       best_score=estimate(readings, self.best_selecting))


class PendingProvisioning(msgspec.Struct, frozen=True, kw_only=True):
    """A resource is unavailable (exit 75): the iteration waits, it is not discarded.

    Attributes:
        it: the iteration that is blocked.
        resource: ``judge`` or ``proposer``.
        reason: the resource's own last line.
        since_ms: when the block began (epoch ms).
    """

    it: int
    resource: str
    reason: str
    since_ms: int


class Spent(msgspec.Struct, frozen=True, kw_only=True):
    """Budget spent so far.

    Attributes:
        iterations: iterations started (a proposer was asked).
        cost_usd: every billed proposer call, failed ones included.
        wall_ms: wall time of baselines, iterations and parks (ms); active time is
            ``wall_ms - parked_total``.
    """

    iterations: int = 0
    cost_usd: float = 0.0
    wall_ms: int = 0


class OpenIteration(msgspec.Struct, frozen=True, kw_only=True):
    """The iteration in flight: what resume needs to record it as abandoned."""

    it: int
    sha: str | None = None
    note: str = ""
    cost_usd: float = 0.0


class LoopExit(enum.StrEnum):
    """How a run ends. Exit codes are the CLI's, documented in docs/crucible.md."""

    FINISHED = "finished"  # the iteration budget is used up or the proposer has nothing more
    SOLVED = "solved"  # the last regime's goal was reached
    BUDGET = "budget"  # the next iteration could overshoot the cost or wall-time budget
    STOPPED = "stopped"  # stop requested (signal), or the judge's fingerprint changed
    ESCALATED = "escalated"  # needs a human: proposer asked, denied change, broken gate, bad baseline

    @property
    def exit_code(self) -> int:
        """The process exit code of ``reel crucible run/resume`` for this exit."""
        return EXIT_CODES[self]

    @property
    def terminal(self) -> bool:
        """True if ``resume`` must not continue the run (everything but ``STOPPED``)."""
        return self is not LoopExit.STOPPED


EXIT_CODES: dict[LoopExit, int] = {
    LoopExit.SOLVED: 0,
    LoopExit.FINISHED: 3,
    LoopExit.BUDGET: 4,
    LoopExit.STOPPED: 5,
    LoopExit.ESCALATED: 6,
}
"""0 only when the goal was met; 1 and 2 stay the generic error / usage codes."""


class SessionOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a finished session reports (``show --json``, the service's reply)."""

    exit: LoopExit
    exit_code: int
    reason: str
    escalated: bool
    solved: bool
    regime: str
    best_score: float
    baseline_score: float
    best_snap: str
    iterations: int
    kept: int
    cost_usd: float
    active_s: float
    parked_s: float


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """The per-run threaded state, plus what the log adds for resume.

    Attributes:
        rows: one per finished iteration, in order.
        spent: budget spent (iterations, cost, wall time).
        kept_shas: snapshots kept, in order (across segments).
        solved_any: some regime's goal was reached.
        parked_total: time spent parked or blocked (excluded from the time budget).
        pending_block: the provisioning block in force, if any.
        segment: the current segment (replaced whole by a rescope).
        open_it: the iteration in flight (``None`` between iterations).
        rescope_to: a regime the proposer asked to move to (handled by the rescope gate).
        exit, exit_reason: how the run ended, once it has.
    """

    rows: tuple[Row, ...] = ()
    spent: Spent = Spent()
    kept_shas: tuple[str, ...] = ()
    solved_any: bool = False
    parked_total: timedelta = timedelta(0)
    pending_block: PendingProvisioning | None = None
    segment: Segment
    open_it: OpenIteration | None = None
    rescope_to: str | None = None
    exit: LoopExit | None = None
    exit_reason: str = ""

    @property
    def next_it(self) -> int:
        """The number the next iteration gets (1-based)."""
        return self.spent.iterations + 1

    @property
    def active_ms(self) -> int:
        """Wall time minus parked time (ms): what the time budget counts."""
        return self.spent.wall_ms - int(self.parked_total / timedelta(milliseconds=1))

    def outcome(self) -> SessionOutcome:
        """The :class:`SessionOutcome` of an ended run.

        Raises:
            ValueError: the run has not ended.
        """
        if self.exit is None:
            raise ValueError("the run has not ended")
        seg = self.segment
        return SessionOutcome(
            exit=self.exit, exit_code=self.exit.exit_code, reason=self.exit_reason,
            escalated=self.exit is LoopExit.ESCALATED, solved=self.solved_any, regime=seg.regime,
            best_score=seg.best_score, baseline_score=seg.baseline_score, best_snap=seg.best_snap,
            iterations=self.spent.iterations, kept=len(self.kept_shas), cost_usd=self.spent.cost_usd,
            active_s=self.active_ms / 1000, parked_s=self.parked_total.total_seconds(),
        )
