"""reel.shared.core.mutators.recovery.abandon: a live executor resolves its own settled intents no drive of it holds
(pure)."""

from __future__ import annotations

from reel.shared.core.decision import Skip
from reel.shared.core.mutators import recovery
from reel.shared.core.run.events import (
    AttemptCancelled,
    AttemptFailed,
    AttemptSucceeded,
    BranchForked,
    RunCancelled,
    RunStarted,
    RunVerifying,
)
from tests.unit.test_mutator_decisions import REF, dispatch, folded, ok


def test_only_its_own_settled_intents_are_abandoned() -> None:
    state, _ = folded([RunStarted(executor_id="x-me", at_ms=1), dispatch("a", 1, "x-me")],  # its drive raised
                      [dispatch("a", 2, "x-me")],  # its next drive superseded a#1
                      [dispatch("b", 1, "x-other")])  # not its own: never touched
    assert [(i.step_id, i.attempt) for i in recovery.own_settled(state, "x-me")] == [("a", 1)]
    assert recovery.own_settled(state, "x-other") == ()  # b#1 is the latest attempt of a running run

    [event] = recovery.abandon(state, "x-me", {"r-1.main.a.1": None}, at_ms=9)
    assert isinstance(event, AttemptFailed) and (event.step_id, event.attempt) == ("a", 1)
    assert event.error_kind == recovery.EXECUTOR_LOST and event.recovered and event.retryable
    assert "x-me abandoned it" in event.message


def test_the_latest_attempt_of_a_running_run_is_never_abandoned() -> None:
    state, _ = folded([RunStarted(executor_id="x-me", at_ms=1), dispatch("a", 1, "x-me")])
    assert recovery.own_settled(state, "x-me") == ()  # the next drive supersedes it (not a try of the step)
    assert recovery.abandon(state, "x-me", {"r-1.main.a.1": None}, at_ms=9) == Skip("nothing to abandon")


def test_a_stored_marker_is_the_outcome_and_an_unlooked_marker_waits() -> None:
    state, _ = folded([RunStarted(executor_id="x-me", at_ms=1), dispatch("a", 1, "x-me")],
                      [dispatch("a", 2, "x-me"), ok("a", 2), dispatch("b", 1, "x-me")],
                      [dispatch("b", 2, "x-me"), ok("b", 2), RunVerifying(branch_id="main", at_ms=3)])
    assert [(i.step_id, i.attempt) for i in recovery.own_settled(state, "x-me")] == [("a", 1), ("b", 1)]
    # a#1's marker was looked up and found; b#1's was not looked up: it is left for a later call
    [event] = recovery.abandon(state, "x-me", {"r-1.main.a.1": REF}, at_ms=9)
    assert isinstance(event, AttemptSucceeded) and event.output_ref == REF and event.recovered
    assert (event.step_id, event.attempt) == ("a", 1)


def test_in_a_cancelled_run_an_abandoned_intent_is_cancelled() -> None:
    state, _ = folded([RunStarted(executor_id="x-me", at_ms=1), dispatch("a", 1, "x-me")],
                      [RunCancelled(at_ms=2)])
    [event] = recovery.abandon(state, "x-me", {"r-1.main.a.1": None}, at_ms=9)
    assert isinstance(event, AttemptCancelled)


def test_an_inherited_copy_is_left_to_recovery_and_its_origin_is_abandoned() -> None:
    state, _ = folded([RunStarted(executor_id="x-me", at_ms=1), dispatch("a", 1, "x-me")],
                      [BranchForked(branch_id="b-2", parent_branch_id="main", fork_lsn=12, at_ms=2)],
                      [dispatch("a", 2, "x-me", branch="b-2")])
    # main#a1 (an inactive branch now) is its own; b-2's copy of a#1 is inherited: recovery resolves it from main's
    assert [(i.branch_id, i.step_id, i.attempt) for i in recovery.own_settled(state, "x-me")] == [("main", "a", 1)]
