"""The agent part of the fold: declarations in order, agent status, fork inheritance by
``(agent index, turn, call)``, views, rewind and recovery over dynamic steps, O(1) per event. No server."""

from __future__ import annotations

import time

import msgspec
import pytest

from reel.shared.core.agent import turnfold
from reel.shared.core.errors import InvalidTransition
from reel.shared.core.mutators import recovery, rewind
from reel.shared.core.run.events import (
    AgentFinished,
    AnyEvent,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    BranchForked,
    Commit,
    DeclaredStep,
    RunCreated,
    StepDecl,
    StepsDeclared,
)
from reel.shared.core.run.fold import apply_commit, fold
from reel.shared.core.run.state import RunState, step_statuses
from reel.shared.core.run.statecodec import encode_state
from reel.shared.core.run.stepids import call_step_id, kv_safe, order_key, parse_step_id, turn_step_id
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.wire.commands import RewindRun
from reel.shared.core.wire.subjects import outcome_key
from reel.shared.nats.eventlog import gc_paused

REF = BlobRef(sha256="a" * 64, size_bytes=3)
FINAL = BlobRef(sha256="f" * 64, size_bytes=9)
STEPS = (StepDecl(step_id="prep", kind="tool"),
         StepDecl(step_id="solve", kind="agent", max_attempts=2, max_turns=5, max_parallel_tools=2),
         StepDecl(step_id="after", kind="model"))


def created() -> RunCreated:
    return RunCreated(run_id="r-1", branch_id="main", workflow_name="w", workflow_ref=REF, created_ms=0, steps=STEPS)


def turn(t: int, agent: str = "solve") -> DeclaredStep:
    return DeclaredStep(step_id=turn_step_id(agent, t), kind="turn", turn=t, max_attempts=2)


def call(t: int, i: int, agent: str = "solve", **kw: object) -> DeclaredStep:
    return DeclaredStep(step_id=call_step_id(agent, t, i), kind="tool_call", turn=t, call_id=f"c{t}{i}",
                        tool_name="read", arguments="{}", **kw)  # type: ignore[arg-type]


def declare(*steps: DeclaredStep, branch: str = "main") -> StepsDeclared:
    return StepsDeclared(branch_id=branch, parent_step="solve", steps=steps)


def dispatch(step: str, n: int = 1, branch: str = "main") -> AttemptDispatched:
    return AttemptDispatched(branch_id=branch, step_id=step, attempt=n, executor_id="x-1", at_ms=n)


def ok(step: str, n: int = 1, branch: str = "main") -> AttemptSucceeded:
    return AttemptSucceeded(branch_id=branch, step_id=step, attempt=n, output_ref=REF, at_ms=n)


def bad(step: str, n: int = 1, branch: str = "main", retryable: bool = False) -> AttemptFailed:
    return AttemptFailed(branch_id=branch, step_id=step, attempt=n, error_kind="tool_error", message="no",
                         retryable=retryable, at_ms=n)


def finished(status: str = "succeeded", turns: int = 2, branch: str = "main") -> AgentFinished:
    return AgentFinished(branch_id=branch, step_id="solve", status=status, turns=turns,  # type: ignore[arg-type]
                         output_ref=FINAL if status == "succeeded" else None, at_ms=9)


def run(*commits: list[AnyEvent]) -> tuple[RunState, list[tuple[int, Commit]]]:
    pairs = [(10 + 2 * i, Commit(commit_id=str(i), run_id="r-1", events=tuple(evs)))
             for i, evs in enumerate([[created()], *commits])]
    state = fold(pairs)
    assert state is not None
    return state, pairs


# a two-turn loop: turn 1 calls two tools (c1 fails: an observation), turn 2 answers
TWO_TURNS: list[list[AnyEvent]] = [
    [dispatch("prep")], [ok("prep")],                                          # 12, 14
    [declare(turn(1)), dispatch("solve:t1")],                                  # 16
    [ok("solve:t1"), declare(call(1, 0), call(1, 1)), dispatch("solve:t1:c0"), dispatch("solve:t1:c1")],  # 18
    [ok("solve:t1:c0")],                                                       # 20
    [bad("solve:t1:c1"), declare(turn(2)), dispatch("solve:t2")],              # 22
    [ok("solve:t2"), finished()],                                              # 24
]


def test_step_ids_are_parsed_ordered_and_kv_safe() -> None:
    assert parse_step_id("solve:t12:c3") == ("solve", 12, 3)
    assert parse_step_id("solve:t2") == ("solve", 2, -1)
    for bad_id in ("solve", "solve:t0", "solve:t1:c01", "a.b:t1", "solve:t1:c", "solve:x1"):
        assert parse_step_id(bad_id) is None, bad_id
    pos = {"prep": 0, "solve": 1, "after": 2}
    ids = ["after", "solve:t2", "solve:t1:c1", "prep", "solve:t1", "solve", "solve:t1:c0", "solve:t10"]
    assert sorted(ids, key=lambda s: order_key(pos, s)) == [
        "prep", "solve", "solve:t1", "solve:t1:c0", "solve:t1:c1", "solve:t2", "solve:t10", "after"]
    assert kv_safe("solve:t1:c0") == "solve=t1=c0" and kv_safe("plain-id_1") == "plain-id_1"
    assert outcome_key("r-1", "main", "solve:t1:c0", 2) == "r-1.main.solve=t1=c0.2"
    assert outcome_key("r-1", "main", "plain", 2) == "r-1.main.plain.2"


def test_declarations_fold_in_order_and_set_the_agent_status() -> None:
    state, _ = run(*TWO_TURNS[:2])
    assert step_statuses(state, "main") == ["succeeded", "pending", "pending"]
    state, _ = run(*TWO_TURNS[:3])
    assert step_statuses(state, "main") == ["succeeded", "running", "pending"]
    state, _ = run(*TWO_TURNS)
    assert step_statuses(state, "main") == ["succeeded", "succeeded", "pending"]
    branch = state.branches["main"]
    assert [d.step_id for d in turnfold.declarations(branch, "solve")] == [
        "solve:t1", "solve:t1:c0", "solve:t1:c1", "solve:t2"]
    assert turnfold.declared(branch, "solve:t1:c1") == call(1, 1)
    assert turnfold.declared(branch, "solve:t1:c2") is None and turnfold.declared(branch, "solve:t3") is None
    rec = turnfold.record(branch, "solve")
    assert rec is not None and rec.finished is not None
    assert (rec.finished.status, rec.finished.output_ref, rec.finished.turns, rec.finished.lsn) == (
        "succeeded", FINAL, 2, 24)


def test_a_failed_agent_skips_the_steps_after_it() -> None:
    state, _ = run(*TWO_TURNS[:5], [bad("solve:t1:c1"), finished("failed", 1)])
    assert step_statuses(state, "main") == ["succeeded", "failed", "skipped"]


@pytest.mark.parametrize(("events", "needle"), [
    ([declare(call(1, 0))], "not the next step"),                               # a call before any turn
    ([declare(turn(2))], "expected 'solve:t1'"),                                # turns count from 1
    ([declare(turn(1), call(1, 1))], "expected 'solve:t1:c0'"),                 # calls count from 0
    ([declare(turn(1), DeclaredStep(step_id="solve:t1:c0", kind="tool_call", turn=2))], "not the next step"),
    ([declare(turn(1)), dispatch("solve:t1:c0")], "undeclared step 'solve:t1:c0'"),
    ([dispatch("solve")], "undeclared step 'solve'"),                           # the agent itself has no attempts
    ([dispatch("solve:t1")], "undeclared step 'solve:t1'"),
    ([StepsDeclared(branch_id="main", parent_step="prep", steps=(turn(1, "prep"),))], "not an agent step"),
    ([StepsDeclared(branch_id="nope", parent_step="solve", steps=(turn(1),))], "unknown branch"),
    ([AgentFinished(branch_id="main", step_id="after", status="failed", turns=0, at_ms=1)], "not an agent step"),
    ([finished(), finished()], "finished twice"),
    ([declare(turn(1)), finished("failed", 1), declare(turn(2))], "has finished"),
])
def test_impossible_agent_events_are_refused(events: list[AnyEvent], needle: str) -> None:
    with pytest.raises(InvalidTransition, match=needle):
        run(events)


def _fork(lsn: int, from_step: str | None) -> list[AnyEvent]:
    return [BranchForked(branch_id="b", parent_branch_id="main", fork_lsn=lsn, from_step=from_step, at_ms=99)]


@pytest.mark.parametrize(("fork_lsn", "from_step", "steps", "done"), [
    (22, "solve:t2", ["prep", "solve:t1", "solve:t1:c0", "solve:t1:c1"], False),   # the golden-log rewind
    (24, "solve:t2", ["prep", "solve:t1", "solve:t1:c0", "solve:t1:c1"], False),
    (18, "solve:t1:c1", ["prep", "solve:t1", "solve:t1:c0"], False),
    (16, "solve:t1", ["prep"], False),
    (24, "solve", ["prep"], False),
    (24, "after", ["prep", "solve:t1", "solve:t1:c0", "solve:t1:c1", "solve:t2"], True),
    (24, None, ["prep", "solve:t1", "solve:t1:c0", "solve:t1:c1", "solve:t2"], True),
    (22, None, ["prep", "solve:t1", "solve:t1:c0", "solve:t1:c1", "solve:t2"], False),
    (18, None, ["prep", "solve:t1", "solve:t1:c0", "solve:t1:c1"], False),
    (14, None, ["prep"], False),
])
def test_a_fork_inherits_dynamic_steps_by_agent_turn_and_call(
        fork_lsn: int, from_step: str | None, steps: list[str], done: bool) -> None:
    state, _ = run(*TWO_TURNS, _fork(fork_lsn, from_step))
    child, parent = state.branches["b"], state.branches["main"]
    assert [s for s in turnfold.step_ids(state.steps, child) if s in child.attempts] == steps
    assert [d.step_id for d in turnfold.declarations(child, "solve")] == [s for s in steps if s.startswith("solve")]
    rec = turnfold.record(child, "solve")
    assert (rec is not None and rec.finished is not None) is done
    assert step_statuses(state, "b")[1] == ("succeeded" if done else "running" if rec else "pending")
    assert len(list(turnfold.declarations(parent, "solve"))) == 4, "the parent's records never change"
    if fork_lsn == 18:  # c0/c1 were in flight at the fork: their outcomes (later) are not inherited
        assert [a.status for a in child.attempts["solve:t1:c0"]] == ["dispatched"]


def test_a_forked_branch_declares_its_own_next_turn() -> None:
    state, _ = run(*TWO_TURNS, _fork(22, "solve:t2"), [declare(turn(2), branch="b"), dispatch("solve:t2", 1, "b")],
                   [bad("solve:t2", 1, "b"), finished("failed", 2, "b")])
    assert step_statuses(state, "b") == ["succeeded", "failed", "skipped"]
    assert step_statuses(state, "main") == ["succeeded", "succeeded", "pending"]


def test_a_branch_without_agents_encodes_as_before() -> None:
    state, _ = run([dispatch("prep")])
    assert b'"agents"' not in encode_state(state)
    state, _ = run(*TWO_TURNS, _fork(14, None))
    assert state.branches["b"].agents is msgspec.UNSET


def test_the_view_lists_turns_and_calls_after_their_agent() -> None:
    state, _ = run(*TWO_TURNS)
    view = build_episode_view(state)
    rows = [(s.step_id, s.kind, s.status, s.parent_step, s.tool_name) for s in view.steps]
    unset = msgspec.UNSET
    assert rows == [("prep", "tool", "succeeded", unset, unset), ("solve", "agent", "succeeded", unset, unset),
                    ("solve:t1", "model", "succeeded", "solve", unset),
                    ("solve:t1:c0", "tool", "succeeded", "solve", "read"),
                    ("solve:t1:c1", "tool", "failed", "solve", "read"),
                    ("solve:t2", "model", "succeeded", "solve", unset), ("after", "model", "pending", unset, unset)]
    assert view.step("solve").output_ref == FINAL and view.step("solve:t1:c0").call_id == "c10"


def test_rewind_at_a_turn_forks_at_the_commit_that_declared_it() -> None:
    state, lsns = run(*TWO_TURNS)
    decision = rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step="solve:t2"), branch_id="b-x", at_ms=5)
    assert isinstance(decision, tuple)
    assert (decision[0].fork_lsn, decision[0].from_step) == (22, "solve:t2")
    at_agent = rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step="solve"), branch_id="b-y", at_ms=5)
    assert isinstance(at_agent, tuple) and at_agent[0].fork_lsn == 14  # just before turn 1
    for missing in ("solve:t3", "solve:t1:c2", "prep:t1", "nope:t1"):
        with pytest.raises(rewind.StepNotFound):
            rewind.decide(state, lsns, RewindRun(run_id="r-1", at_step=missing), branch_id="b-z", at_ms=5)


def test_recovery_sees_open_intents_of_tool_calls() -> None:
    state, _ = run(*TWO_TURNS[:4])
    intents = recovery.open_intents(state)
    assert [(i.step_id, i.marker_key) for i in intents] == [
        ("solve:t1:c0", "r-1.main.solve=t1=c0.1"), ("solve:t1:c1", "r-1.main.solve=t1=c1.1")]


def _long_agent(turns: int) -> list[tuple[int, Commit]]:
    pairs = [(1, Commit(commit_id="0", run_id="r-1", events=(created(),)))]
    lsn = 1
    for t in range(1, turns + 1):
        c = call_step_id("solve", t, 0)
        for events in ([declare(turn(t)), dispatch(turn_step_id("solve", t))],
                       [ok(turn_step_id("solve", t)), declare(call(t, 0)), dispatch(c)], [ok(c)]):
            lsn += 1
            pairs.append((lsn, Commit(commit_id=str(lsn), run_id="r-1", events=tuple(events))))
    return pairs


def _tail_cost(pairs: list[tuple[int, Commit]], upto: int, n: int) -> float:
    """Best-of-3 seconds to apply ``pairs[upto:upto + n]`` onto the state folded to ``upto`` (GC paused)."""
    best = float("inf")
    for _ in range(3):
        state = fold(pairs[:upto])
        with gc_paused():
            start = time.perf_counter()
            for lsn, commit in pairs[upto:upto + n]:
                state = apply_commit(state, lsn, commit)
            best = min(best, time.perf_counter() - start)
    return best


def test_folding_an_agent_commit_costs_the_same_at_turn_10_and_turn_3000() -> None:
    """O(1) per event: the last 600 commits of a 3000-turn loop fold as fast as early ones."""
    pairs = _long_agent(3000)
    early, late = _tail_cost(pairs, 30, 600), _tail_cost(pairs, len(pairs) - 600, 600)
    assert late < early * 3, (early, late)
