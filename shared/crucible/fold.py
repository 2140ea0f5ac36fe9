"""The session state is a pure fold of its log (resume = fold).

``fold(commits)`` turns a session's ordered ``(lsn, SessionCommit)`` pairs into a
:class:`SessionState`: the frozen config (from ``SessionStarted``) and the
:class:`~reel.shared.crucible.state.Run` (from the first ``SegmentOpened`` on). The loop
folds each event it commits with the same :func:`apply`, so a live ``Run`` and a
cold re-fold of the log are equal — which is what makes ``resume`` exact.

No clock, I/O, randomness or logging here; times arrive in the events.

The Segment factoring keeps replay simple (open question 3): a ``SegmentOpened``
carries every field of the new segment, and the fold assigns
``run.segment = Segment.baseline(...)`` exactly as the live rescope does.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import msgspec
from msgspec.structs import replace

from reel.shared.core.errors import InvalidTransition
from reel.shared.crucible.events import (
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
    ProvisioningBlocked,
    ProvisioningCleared,
    SegmentOpened,
    SessionCommit,
    SessionEnded,
    SessionResumed,
    SessionStarted,
)
from reel.shared.crucible.state import (
    Fate,
    OpenIteration,
    PendingProvisioning,
    Reading,
    Row,
    Run,
    Segment,
    Spent,
    WorldSha,
)


class SessionState(msgspec.Struct, frozen=True, kw_only=True):
    """A folded session.

    Attributes:
        started: the ``SessionStarted`` event (config, world, protected paths).
        run: the loop state, ``None`` until the first baseline is in.
        ended: the last ``SessionEnded`` not followed by a resume (also before any baseline).
        lsn: the LSN of the last folded commit (the writer's expected sequence).
    """

    started: SessionStarted
    run: Run | None = None
    ended: SessionEnded | None = None
    lsn: int = 0

    @property
    def session_id(self) -> str:
        return self.started.session_id


def _spend(run: Run, *, iterations: int = 0, cost_usd: float = 0.0, wall_ms: int = 0) -> Spent:
    s = run.spent
    return Spent(iterations=s.iterations + iterations, cost_usd=s.cost_usd + cost_usd, wall_ms=s.wall_ms + wall_ms)


def _open_segment(run: Run | None, e: SegmentOpened) -> Run:
    segment = Segment.baseline(regime=e.regime, fingerprint=e.fingerprint, reading=e.reading, snap=WorldSha(e.snap))
    parked = timedelta(milliseconds=e.parked_ms)
    if run is None:
        return Run(segment=segment, spent=Spent(wall_ms=e.wall_ms, cost_usd=e.reading.cost_usd),
                   solved_any=e.goal_met, parked_total=parked)
    return replace(run, segment=segment, rescope_to=None, solved_any=run.solved_any or e.goal_met,
                   spent=_spend(run, wall_ms=e.wall_ms, cost_usd=e.reading.cost_usd),
                   parked_total=run.parked_total + parked)


def _close(run: Run, row: Row) -> Run:
    segment, kept = run.segment, run.kept_shas
    if row.verdict is Fate.KEEP and row.kept_sha is not None and row.score is not None:
        readings = tuple(v for v in row.readings if v is not None)
        segment = segment.promoted(row.score, WorldSha(row.kept_sha), readings, row.selecting)
        kept = (*kept, row.kept_sha)
    return replace(run, rows=(*run.rows, row), segment=segment, kept_shas=kept, open_it=None, pending_block=None,
                   solved_any=run.solved_any or row.goal_met, spent=_spend(run, wall_ms=row.wall_ms))


def _touch(run: Run, it: int) -> Run:
    """The run with iteration ``it`` open; opening a new one counts it against the iteration budget."""
    if run.open_it is not None and run.open_it.it == it:
        return run
    return replace(run, open_it=OpenIteration(it=it), spent=_spend(run, iterations=1))


def apply_run(run: Run, event: AnySessionEvent) -> Run:
    """One event applied to a ``Run`` (every event after the first baseline).

    Raises:
        InvalidTransition: an event that cannot follow (e.g. a second ``SessionStarted``).
    """
    match event:
        case SegmentOpened():
            return _open_segment(run, event)
        case ProposalMade(it=it, cost_usd=cost, note=note, outcome=outcome, detail=detail):
            # the iteration is counted (and billed) whatever becomes of it
            run = _touch(run, it)
            assert run.open_it is not None
            open_it = replace(run.open_it, note=note, cost_usd=run.open_it.cost_usd + cost)
            return replace(run, open_it=open_it, spent=_spend(run, cost_usd=cost),
                           rescope_to=detail if outcome == "rescope" else run.rescope_to)
        case ProvisioningBlocked(it=it, resource=res, reason=reason, cost_usd=cost, at_ms=at):
            run = _touch(run, it)
            assert run.open_it is not None
            prev = run.pending_block
            since = prev.since_ms if prev is not None and (prev.it, prev.resource) == (it, res) else at
            return replace(run, pending_block=PendingProvisioning(it=it, resource=res, reason=reason, since_ms=since),
                           open_it=replace(run.open_it, cost_usd=run.open_it.cost_usd + cost),
                           spent=_spend(run, cost_usd=cost))
        case ProvisioningCleared(waited_ms=waited):
            return replace(run, pending_block=None, parked_total=run.parked_total + timedelta(milliseconds=waited))
        case CandidateApplied(it=it, sha=sha):
            run = _touch(run, it)
            assert run.open_it is not None
            return replace(run, open_it=replace(run.open_it, sha=sha))
        case MeasureFinished(target=target, reading=reading):
            if target == "incumbent" and isinstance(reading, Reading):
                run = replace(run, segment=run.segment.remeasured(reading.values))
            if not reading.cost_usd:
                return run
            o = run.open_it
            return replace(run, open_it=None if o is None else replace(o, cost_usd=o.cost_usd + reading.cost_usd),
                           spent=_spend(run, cost_usd=reading.cost_usd))
        case ParkEnded(parked_ms=parked):
            return replace(run, parked_total=run.parked_total + timedelta(milliseconds=parked),
                           spent=_spend(run, wall_ms=parked))
        case IterationClosed(row=row):
            return _close(run, row)
        case SessionResumed(abandoned=abandoned):
            run = _close(run, abandoned) if abandoned is not None else replace(run, open_it=None, pending_block=None)
            return replace(run, exit=None, exit_reason="")
        case SessionEnded(exit=exit_, reason=reason):
            return replace(run, exit=exit_, exit_reason=reason, open_it=None)
        case (ParkStarted() | CandidateDenied() | ApplyFailed() | MeasureStarted()
              | FingerprintChanged() | Escalated()):
            return run  # recorded for the reader; the row carries their effect
        case SessionStarted():
            raise InvalidTransition(f"session {event.session_id} started twice")
    raise InvalidTransition(f"unknown crucible event {type(event).__name__}")  # pragma: no cover


def apply(state: SessionState | None, lsn: int, event: AnySessionEvent) -> SessionState:
    """One event (of the commit at ``lsn``) applied to a session state.

    Raises:
        InvalidTransition: the first event is not ``SessionStarted``, or an event
            needs a run before the first baseline.
    """
    if state is None:
        if not isinstance(event, SessionStarted):
            raise InvalidTransition(f"a session log must start with session_started, not {type(event).__name__}")
        return SessionState(started=event, lsn=lsn)
    if state.ended is not None and state.ended.exit.terminal:
        raise InvalidTransition(f"{type(event).__name__} after the session ended ({state.ended.exit.value})")
    ended = event if isinstance(event, SessionEnded) else None if isinstance(event, SessionResumed) else state.ended
    if state.run is None:
        if isinstance(event, SegmentOpened):
            return replace(state, run=_open_segment(None, event), ended=ended, lsn=lsn)
        if isinstance(event, SessionEnded | Escalated | SessionResumed):
            return replace(state, ended=ended, lsn=lsn)  # ended (or resumed) before any baseline
        raise InvalidTransition(f"{type(event).__name__} before the first baseline")
    return replace(state, run=apply_run(state.run, event), ended=ended, lsn=lsn)


def apply_commit(state: SessionState | None, lsn: int, commit: SessionCommit) -> SessionState:
    """Every event of one commit, in order."""
    for event in commit.events:
        state = apply(state, lsn, event)
    if state is None:
        raise InvalidTransition("empty commit at the start of a session log")
    return state


def fold(commits: Iterable[tuple[int, SessionCommit]]) -> SessionState | None:
    """Cold fold of a session log (``None`` for an empty log)."""
    state: SessionState | None = None
    for lsn, commit in commits:
        state = apply_commit(state, lsn, commit)
    return state
