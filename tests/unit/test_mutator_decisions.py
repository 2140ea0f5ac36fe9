"""The pure cores of the mutator services (cancel, rewind, recovery), on hand-folded states — no server."""

from __future__ import annotations

import msgspec
import pytest

from reel.shared.core.decision import Skip
from reel.shared.core.errors import InvalidCommand, InvalidTransition
from reel.shared.core.mutators import recovery, rewind
from reel.shared.core.mutators.cancel import after_cancel
from reel.shared.core.mutators.cancel import decide as decide_cancel
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    BranchForked,
    Commit,
    RunCancelled,
    RunCreated,
    RunStarted,
    RunVerifying,
    StepDecl,
    encode_commit,
)
from reel.shared.core.run.fold import fold
from reel.shared.core.run.state import RunState
from reel.shared.core.run.statecodec import encode_state
from reel.shared.core.wire.commands import CancelRun, RewindRun, encode

REF = BlobRef(sha256="a" * 64, size_bytes=3)
OTHER_REF = BlobRef(sha256="b" * 64, size_bytes=5)


def folded(*commits: list[AnyEvent], first_lsn: int = 10, stride: int = 2
           ) -> tuple[RunState, list[tuple[int, Commit]]]:
    """Fold commits at LSNs first_lsn, first_lsn+stride, … (gaps: other runs' commits)."""
    created = RunCreated(run_id="r-1", branch_id="main", workflow_name="w", workflow_ref=REF, created_ms=0,
                         steps=(StepDecl(step_id="a", kind="tool"), StepDecl(step_id="b", kind="tool", max_attempts=3)))
    pairs = [(first_lsn + i * stride, Commit(commit_id=str(i), run_id="r-1", events=tuple(evs)))
             for i, evs in enumerate([[created], *commits])]
    state = fold(pairs)
    assert state is not None
    return state, pairs


def dispatch(step: str, n: int, ex: str = "x-1", branch: str = "main") -> AttemptDispatched:
    return AttemptDispatched(branch_id=branch, step_id=step, attempt=n, executor_id=ex, at_ms=n)


def ok(step: str, n: int, branch: str = "main", ref: BlobRef = REF) -> AttemptSucceeded:
    return AttemptSucceeded(branch_id=branch, step_id=step, attempt=n, output_ref=ref, at_ms=n)


# ---- cancel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("events, expect", [
    ([], tuple),
    ([[RunStarted(executor_id="x-1", at_ms=1)]], tuple),
    ([[RunVerifying(branch_id="main", at_ms=1)]], tuple),
    ([[RunCancelled(at_ms=1)]], Skip),
])
def test_cancel_decision(events: list[list[AnyEvent]], expect: type) -> None:
    state, _ = folded(*events)
    assert isinstance(decide_cancel(state, CancelRun(run_id="r-1"), at_ms=5), expect)


def test_who_cancels_or_rewinds_is_recorded_and_nobody_named_encodes_as_before() -> None:
    state, lsns = ran_a_then_b()
    (cancelled,) = decide_cancel(state, CancelRun(run_id="r-1", reason="stop", by="alice"), at_ms=5)  # type: ignore[misc]
    (forked,) = rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step="b", by="alice"),  # type: ignore[misc]
                              branch_id="b-new", at_ms=1)
    assert (cancelled.by, forked.by) == ("alice", "alice")
    assert b'"by":"alice"' in encode_commit(Commit(commit_id="c", run_id="r-1", events=(cancelled, forked)))
    (anon,) = decide_cancel(state, CancelRun(run_id="r-1", reason="stop"), at_ms=5)  # type: ignore[misc]
    assert encode_commit(Commit(commit_id="c", run_id="r-1", events=(anon,))) == (
        b'{"v":1,"commit_id":"c","run_id":"r-1","writer":"","events":[{"type":"run_cancelled","reason":"stop",'
        b'"at_ms":5}]}')
    assert encode(CancelRun(run_id="r-1")) == b'{"run_id":"r-1","reason":""}'  # what an older service decodes
    after, _ = folded([RunStarted(executor_id="x-1", at_ms=1)], [dispatch("a", 1)], [ok("a", 1)],
                      [forked], [cancelled])
    assert (after.cancelled_by, after.branches["b-new"].forked_by) == ("alice", "alice")  # the state says who
    unnamed, _ = folded([RunStarted(executor_id="x-1", at_ms=1)], [anon])
    assert unnamed.cancelled_by is msgspec.UNSET and b"cancelled_by" not in encode_state(unnamed)


# ---- rewind ---------------------------------------------------------------------------------


def ran_a_then_b() -> tuple[RunState, list[tuple[int, Commit]]]:
    # LSNs: 10 created, 12 started, 14 a#1, 16 a ok, 18 b#1, 20 b ok, 22 verifying
    return folded([RunStarted(executor_id="x-1", at_ms=1)], [dispatch("a", 1)], [ok("a", 1)], [dispatch("b", 1)],
                  [ok("b", 1)], [RunVerifying(branch_id="main", at_ms=9)])


def test_rewind_at_step_forks_just_before_its_first_attempt() -> None:
    state, lsns = ran_a_then_b()
    d = rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step="b"), branch_id="b-new", at_ms=1)
    assert isinstance(d, tuple)
    assert (d[0].parent_branch_id, d[0].fork_lsn, d[0].from_step) == ("main", 16, "b")


def test_rewind_lineage_of_a_fork_skips_the_gap_between_fork_point_and_creation() -> None:
    fork = BranchForked(branch_id="b-2", parent_branch_id="main", fork_lsn=14, from_step=None, at_ms=1)
    state, lsns = folded([RunStarted(executor_id="x-1", at_ms=1)], [dispatch("a", 1)], [ok("a", 1)],
                         [dispatch("b", 1)], [ok("b", 1)], [RunVerifying(branch_id="main", at_ms=9)], [fork])
    assert rewind.lineage_lsns(state, lsns, "b-2") == [10, 12, 14, 24]
    with pytest.raises(rewind.LsnNotInLineage):
        rewind.decide(state, lsns, RewindRun(run_id="r-1", branch="b-2", at_lsn=16), branch_id="b-3", at_ms=1)
    with pytest.raises(rewind.LsnNotInLineage):  # an LSN of another run (the gaps)
        rewind.decide(state, lsns, RewindRun(run_id="r-1", at_lsn=11), branch_id="b-3", at_ms=1)
    # the inherited a#1 is in flight on b-2 (its outcome came after LSN 14)
    assert state.branches["b-2"].attempts["a"][0].status == "dispatched"


def test_rewind_refuses_an_lsn_of_a_sibling_or_child_branch() -> None:
    # 10 created, 12 started, 14 a#1, 16 a ok (main); 18 fork b-1 at 14, 20 a#2 on b-1; 22 fork b-2 at 16 (from
    # main), 24 b#1 on b-2, 26 run_started (names no branch: b-2's, the active one)
    fork1 = BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=14, from_step=None, at_ms=1)
    fork2 = BranchForked(branch_id="b-2", parent_branch_id="main", fork_lsn=16, from_step=None, at_ms=2)
    state, commits = folded([RunStarted(executor_id="x-1", at_ms=1)], [dispatch("a", 1)], [ok("a", 1)], [fork1],
                            [dispatch("a", 2, branch="b-1")], [fork2], [dispatch("b", 1, branch="b-2")],
                            [RunStarted(executor_id="x-2", at_ms=3)])
    assert [(lsn, sorted(b)) for lsn, b in rewind.commit_branches(commits)] == [
        (10, ["main"]), (12, ["main"]), (14, ["main"]), (16, ["main"]), (18, ["b-1"]), (20, ["b-1"]),
        (22, ["b-2"]), (24, ["b-2"]), (26, ["b-2"])]  # a commit naming no branch: the active one's
    assert rewind.lineage_lsns(state, commits, "main") == [10, 12, 14, 16]
    assert rewind.lineage_lsns(state, commits, "b-1") == [10, 12, 14, 18, 20]
    assert rewind.lineage_lsns(state, commits, "b-2") == [10, 12, 14, 16, 22, 24, 26]
    for branch, lsn, owner in (("b-1", 24, "b-2"), ("b-2", 20, "b-1"), ("b-1", 16, "main"), ("main", 18, "b-1")):
        with pytest.raises(rewind.LsnNotInLineage, match=f"a commit of branch '{owner}', not on the lineage of"
                                                         f" branch '{branch}'"):
            rewind.decide(state, commits, RewindRun(run_id="r-1", branch=branch, at_lsn=lsn), branch_id="b-3",
                          at_ms=1)
    d = rewind.decide(state, commits, RewindRun(run_id="r-1", branch="b-1", at_lsn=20), branch_id="b-3", at_ms=1)
    assert isinstance(d, tuple) and d[0].fork_lsn == 20
    # at a step that never ran on b-1: the branch's own last commit, not the run's head (a sibling's)
    d = rewind.decide(state, commits, RewindRun(run_id="r-1", branch="b-1", at_step="b"), branch_id="b-4", at_ms=1)
    assert isinstance(d, tuple) and d[0].fork_lsn == 20


def test_rewind_at_a_step_that_never_ran_forks_at_the_head() -> None:
    state, lsns = folded([RunStarted(executor_id="x-1", at_ms=1)], [dispatch("a", 1)])
    d = rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step="b"), branch_id="b-new", at_ms=1)
    assert isinstance(d, tuple) and d[0].fork_lsn == state.head_lsn


def test_rewind_repeated_key_returns_the_branch_and_rejects_other_parameters() -> None:
    fork = BranchForked(branch_id="b-k", parent_branch_id="main", fork_lsn=16, from_step="b", at_ms=1)
    state, lsns = folded([RunStarted(executor_id="x-1", at_ms=1)], [dispatch("a", 1)], [ok("a", 1)], [fork])
    again = rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step="b"), branch_id="b-k", at_ms=2)
    assert again == rewind.BRANCH_EXISTS and "b-k" in state.branches
    with pytest.raises(rewind.IdempotencyKeyReused):
        rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step="a"), branch_id="b-k", at_ms=2)


@pytest.mark.parametrize("cmd, error", [
    (RewindRun(run_id="r-1"), InvalidCommand),
    (RewindRun(run_id="r-1", at_step="a", at_lsn=10), InvalidCommand),
    (RewindRun(run_id="r-1", branch="zzz", at_step="a"), rewind.BranchNotFound),
    (RewindRun(run_id="r-1", at_step="zzz"), rewind.StepNotFound),
    (RewindRun(run_id="r-1", at_lsn=99), rewind.LsnNotInLineage),
    (RewindRun(run_id="r-1", at_lsn=-1), rewind.LsnNotInLineage),
])
def test_rewind_refusals(cmd: RewindRun, error: type[Exception]) -> None:
    state, lsns = ran_a_then_b()
    with pytest.raises(error):
        rewind.decide(state, lsns, cmd, branch_id="b-new", at_ms=1)


def test_rewind_of_a_cancelled_run_is_refused() -> None:
    state, lsns = folded([RunCancelled(at_ms=1)])
    with pytest.raises(InvalidTransition):
        rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step="a"), branch_id="b-new", at_ms=1)


# ---- recovery -------------------------------------------------------------------------------


def test_superseded_intent_is_resolved_only_when_its_executor_is_gone() -> None:
    state, _ = folded([dispatch("a", 1, "x-dead")], [dispatch("a", 2, "x-new")])
    t = recovery.triage(state, {"x-new"})
    assert [(i.step_id, i.attempt) for i in t.resolve] == [("a", 1)] and not t.resume
    t = recovery.triage(state, {"x-new", "x-dead"})
    assert not t.resolve and [(w.intent.attempt, w.reason) for w in t.waiting] == [(1, "executor_alive"),
                                                                                (2, "executor_alive")]


def test_latest_intent_of_a_running_run_asks_for_a_resume_instead() -> None:
    state, _ = folded([RunStarted(executor_id="x-dead", at_ms=1)], [dispatch("a", 1, "x-dead")])
    t = recovery.triage(state, set())
    assert not t.resolve and t.resume and t.waiting[0].reason == "latest_attempt"
    state, _ = folded([RunStarted(executor_id="x-dead", at_ms=1)], [dispatch("a", 1, "x-dead")],
                      [RunStarted(executor_id="x-new", at_ms=2)])
    t = recovery.triage(state, {"x-new"})  # a new owner took the run over: it will supersede
    assert not t.resolve and not t.resume and t.waiting[0].reason == "owner_alive"


def test_intent_of_a_resting_run_is_resolved_with_the_marker_or_as_lost() -> None:
    state, _ = folded([dispatch("a", 1, "x-dead")], [dispatch("b", 1, "x-dead")],
                      [RunVerifying(branch_id="main", at_ms=3)])
    t = recovery.triage(state, set())
    assert [i.marker_key for i in t.resolve] == ["r-1.main.a.1", "r-1.main.b.1"]
    events = recovery.resolution_events(state, t.resolve, {"r-1.main.a.1": REF}, at_ms=7)
    assert isinstance(events[0], AttemptSucceeded) and events[0].output_ref == REF and events[0].recovered
    assert isinstance(events[1], AttemptFailed) and events[1].error_kind == recovery.EXECUTOR_LOST
    assert events[1].recovered


def test_intents_of_a_cancelled_run_are_resolved_cancelled_whatever_the_marker() -> None:
    fork = BranchForked(branch_id="b-2", parent_branch_id="main", fork_lsn=14, from_step=None, at_ms=1)
    # a#1 on main (left open when the run was rewound: an abandoned branch), then b#1 on b-2, then the cancel
    state, _ = folded([dispatch("a", 1, "x-dead")], [ok("a", 1)], [dispatch("b", 1, "x-dead")], [fork],
                      [dispatch("b", 2, "x-dead", branch="b-2")], [RunCancelled(reason="stop", at_ms=3)])
    t = recovery.triage(state, set())
    keys = {"r-1.main.b.1": REF, "r-1.b-2.b.2": REF}
    assert sorted(i.marker_key for i in t.resolve) == sorted(keys)
    by_branch = {e.branch_id: e for e in recovery.resolution_events(state, t.resolve, keys, at_ms=7)}
    # the active branch's attempt is cancelled although its executor stored an output; the abandoned one is not
    assert isinstance(by_branch["b-2"], AttemptCancelled) and by_branch["b-2"].recovered
    assert by_branch["b-2"].reason == "run cancelled: stop"
    assert isinstance(by_branch["main"], AttemptSucceeded) and by_branch["main"].recovered
    assert recovery.outcome_of(by_branch["b-2"]) == "cancelled"


def test_after_cancel_records_in_flight_outcomes_cancelled_and_nothing_else() -> None:
    state, _ = folded([dispatch("a", 1)], [ok("a", 1)], [dispatch("b", 1)])
    fail_b = AttemptFailed(branch_id="main", step_id="b", attempt=1, error_kind="tool_error", message="m", at_ms=9)
    planned = [fail_b, dispatch("b", 2)]
    assert after_cancel(state, planned) == planned  # a live run: unchanged
    cancelled, _ = folded([dispatch("a", 1)], [ok("a", 1)], [dispatch("b", 1)], [RunCancelled(reason="r", at_ms=5)])
    [only] = after_cancel(cancelled, [*planned, ok("a", 1), ok("b", 1)])  # a#1 is resolved: dropped; b#2 never starts
    assert isinstance(only, AttemptCancelled) and (only.step_id, only.attempt, only.at_ms) == ("b", 1, 9)
    assert only.reason == "run cancelled: r" and not only.recovered
    assert after_cancel(cancelled, [ok("a", 1)]) == []


def test_inherited_intent_is_resolved_from_its_origin_even_with_a_live_executor() -> None:
    fork = BranchForked(branch_id="b-2", parent_branch_id="main", fork_lsn=12, from_step=None, at_ms=1)
    # 10 created, 12 a#1 by x-live, 14 a ok (after the fork point), 16 fork, 18 a#2 on b-2
    state, _ = folded([dispatch("a", 1, "x-live")], [ok("a", 1, ref=OTHER_REF)], [fork],
                      [dispatch("a", 2, "x-live", branch="b-2")])
    intent, latest = recovery.open_intents(state)  # the inherited a#1 and the in-flight a#2
    assert (intent.branch_id, intent.origin_branch_id, intent.superseded) == ("b-2", "main", True)
    assert (latest.attempt, latest.inherited) == (2, False)
    t = recovery.triage(state, {"x-live"})
    assert t.resolve == (intent,) and [w.intent for w in t.waiting] == [latest]
    [event] = recovery.resolution_events(state, t.resolve, {}, at_ms=1)
    assert isinstance(event, AttemptSucceeded) and event.output_ref == OTHER_REF and event.branch_id == "b-2"


def test_intent_on_an_abandoned_branch_is_settled() -> None:
    fork = BranchForked(branch_id="b-2", parent_branch_id="main", fork_lsn=10, from_step=None, at_ms=1)
    state, _ = folded([RunStarted(executor_id="x-dead", at_ms=1)], [dispatch("a", 1, "x-dead")], [fork])
    t = recovery.triage(state, set())
    assert [(i.branch_id, i.marker_key) for i in t.resolve] == [("main", "r-1.main.a.1")]


@pytest.mark.parametrize("events, owner_alive, expect", [
    ([[RunStarted(executor_id="x-1", at_ms=1)]], True, False),  # its live owner drives it: no second loop
    ([[RunStarted(executor_id="x-1", at_ms=1)]], False, True),  # the owner is gone
    ([[RunStarted(executor_id="x-1", at_ms=1)], [RunVerifying(branch_id="main", at_ms=2)]], True, True),  # rested
    ([], False, True),  # pending, never claimed
])
def test_rewind_resumes_unless_the_live_owner_drives_the_run(
    events: list[list[AnyEvent]], owner_alive: bool, expect: bool
) -> None:
    state, _ = folded(*events)
    assert rewind.needs_resume(state, owner_alive) is expect
