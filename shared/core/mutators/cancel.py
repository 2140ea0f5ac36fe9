"""Cancel's pure core: whether a :class:`~reel.shared.core.wire.commands.CancelRun` cancels the run,
and what becomes of the outcomes of attempts the cancel caught in flight.

Cancelling is legal from ``pending``, ``running``, ``awaiting_input`` and ``verifying``
(:data:`~reel.shared.core.run.state.LIVE`;
the fold closes a waiting run's open input requests with it);
a run that already ended is left as it is (a :class:`~reel.shared.core.decision.Skip`: the caller's intent, "not
running",
holds already). After the ``run_cancelled`` commit, an attempt on the run's active branch is
never recorded succeeded or failed: :func:`after_cancel` turns its outcome into
``attempt_cancelled`` (the executor decides every commit through it; recovery resolves a dead
executor's open intents the same way). No clock, I/O or randomness: the time comes in as an argument.
"""

from __future__ import annotations

from collections.abc import Sequence

from reel.shared.core.decision import Decision, Skip
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptCancelled,
    AttemptFailed,
    AttemptSucceeded,
    Commit,
    RunCancelled,
)
from reel.shared.core.run.state import CANCELLED, LIVE, AttemptStatus, RunState
from reel.shared.core.wire.commands import CancelRun


def decide(state: RunState, cmd: CancelRun, *, at_ms: int) -> Decision:
    """Pure: ``(run_cancelled,)`` cancelling ``state`` (at ``at_ms``, epoch ms), or ``Skip`` (the run ended)."""
    if state.status in LIVE:
        return (RunCancelled(reason=cmd.reason, at_ms=at_ms, by=cmd.by),)
    return Skip(f"run is already {state.status}")


def cancel_lsn(commits: Sequence[tuple[int, Commit]]) -> int | None:
    """The LSN of the ``run_cancelled`` among ``commits`` (``(lsn, commit)`` pairs of one run), or ``None``."""
    return next((lsn for lsn, c in commits for e in c.events if isinstance(e, RunCancelled)), None)


def cancel_reason(state: RunState) -> str:
    """The ``reason`` of an ``attempt_cancelled`` in the cancelled run ``state``."""
    return f"run cancelled: {state.cancel_reason}" if state.cancel_reason else "run cancelled"


def caught(state: RunState, branch_id: str) -> bool:
    """True when outcomes of attempts on ``branch_id`` are recorded ``attempt_cancelled`` in ``state``:
    the run is cancelled and ``branch_id`` is its active branch (the one the cancel stopped)."""
    return state.status == CANCELLED and branch_id == state.active_branch


def as_cancelled(state: RunState, event: AttemptSucceeded | AttemptFailed, *, recovered: bool | None = None
                 ) -> AttemptCancelled:
    """``event``'s attempt recorded cancelled instead (usage and time kept; ``recovered``: default the event's)."""
    return AttemptCancelled(branch_id=event.branch_id, step_id=event.step_id, attempt=event.attempt,
                            reason=cancel_reason(state), usage=event.usage, at_ms=event.at_ms,
                            recovered=event.recovered if recovered is None else recovered)


def after_cancel(state: RunState, events: Sequence[AnyEvent]) -> Sequence[AnyEvent]:
    """``events`` as they may be committed on ``state`` (pure).

    Unchanged unless the run is cancelled. On a cancelled run only outcomes of attempts still
    ``dispatched`` are kept (the first per attempt) — those on the active branch as ``attempt_cancelled`` — and every
    other event (an intent, a declaration, an ``agent_finished`` planned before the cancel was
    seen) is dropped: nothing new starts, and no attempt the cancel caught is recorded succeeded
    or failed. The result may be empty (nothing to commit).
    """
    if state.status != CANCELLED:
        return events
    out: list[AnyEvent] = []
    seen: set[tuple[str, str, int]] = set()
    for e in events:
        if not isinstance(e, AttemptSucceeded | AttemptFailed | AttemptCancelled):
            continue
        key = (e.branch_id, e.step_id, e.attempt)
        if key in seen:  # one outcome per attempt
            continue
        seen.add(key)
        branch = state.branches.get(e.branch_id)
        attempts = branch.attempts.get(e.step_id, ()) if branch is not None else ()
        found = next((a for a in attempts if a.attempt == e.attempt), None)
        if found is None or found.status != AttemptStatus.DISPATCHED:
            continue
        out.append(as_cancelled(state, e) if not isinstance(e, AttemptCancelled) and caught(state, e.branch_id) else e)
    return out
