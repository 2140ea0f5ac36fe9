"""The executor's pure decisions (shared/core/run/planning.py), on hand-folded states — no server."""

from __future__ import annotations

import pytest

from reel.shared.core.run import planning as plan
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    Commit,
    RunCreated,
    RunStarted,
    StepDecl,
)
from reel.shared.core.run.fold import fold
from reel.shared.core.run.planning import outcome_recorded
from reel.shared.core.run.state import RunState

REF = BlobRef(sha256="a" * 64, size_bytes=3)


def folded(*commits: list[AnyEvent]) -> RunState:
    created = RunCreated(run_id="r-1", branch_id="main", workflow_name="w", workflow_ref=REF, created_ms=0,
                         steps=(StepDecl(step_id="a", kind="tool", max_attempts=3),))
    started = [RunStarted(executor_id="x-1", at_ms=1)]
    state = fold((lsn, Commit(commit_id=str(lsn), run_id="r-1", events=tuple(evs)))
                 for lsn, evs in enumerate([[created], started, *commits], start=1))
    assert state is not None
    return state


def dispatch(n: int) -> AttemptDispatched:
    return AttemptDispatched(branch_id="main", step_id="a", attempt=n, executor_id="x-1", at_ms=n)


@pytest.mark.parametrize("commits, attempt, recorded", [
    ([[dispatch(1)]], 1, False),  # still open: the outcome is recorded on top of whoever committed
    ([[dispatch(1)], [AttemptSucceeded(branch_id="main", step_id="a", attempt=1, output_ref=REF, at_ms=2)]], 1, True),
    ([[dispatch(1)], [AttemptFailed(branch_id="main", step_id="a", attempt=1, error_kind="x", message="",
                                    retryable=True, at_ms=2)]], 1, True),
    ([[dispatch(1)], [AttemptSucceeded(branch_id="main", step_id="a", attempt=1, output_ref=REF, at_ms=2,
                                       recovered=True)]], 1, True),  # recovery resolved it meanwhile
    ([[dispatch(1)], [dispatch(2)]], 1, False),  # superseded but unresolved: still takes its outcome
    ([[dispatch(1)]], 2, True),  # no such attempt on the branch
    ([], 1, True),  # the step has no attempt at all
])
def test_outcome_recorded(commits: list[list[AnyEvent]], attempt: int, recorded: bool) -> None:
    assert outcome_recorded(folded(*commits), "main", "a", attempt) is recorded


def test_outcome_recorded_on_an_unknown_branch_raises() -> None:
    with pytest.raises(KeyError):
        outcome_recorded(folded([dispatch(1)]), "b-gone", "a", 1)


@pytest.mark.parametrize("commits, expected", [
    ([], plan.Dispatch("main", "a", 1)),  # nothing before it
    ([[dispatch(1)]], plan.Dispatch("main", "a", 2, supersedes=1)),  # an orphan: its marker is read first
    ([[dispatch(1)], [AttemptFailed(branch_id="main", step_id="a", attempt=1, error_kind="x", message="",
                                    retryable=True, at_ms=2)]], plan.Dispatch("main", "a", 2)),  # a failure: retry
])
def test_a_dispatch_names_the_orphan_it_supersedes(commits: list[list[AnyEvent]], expected: plan.Dispatch) -> None:
    assert plan.next_action(folded(*commits), "x-1") == expected


def test_an_attempt_in_flight_here_is_waited_for_not_superseded() -> None:
    assert isinstance(plan.next_action(folded([dispatch(1)]), "x-1", (("main", "a", 1),)), plan.Wait)
