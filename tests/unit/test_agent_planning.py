"""Planning inside agent steps: the loop driven end to end through the pure core by the
reference driver (tests/unit/agent_sim.py), and each decision of ``agent_action`` and each commit builder alone."""

from __future__ import annotations

from typing import Any

import msgspec

from reel.shared.core.agent import commits as ac
from reel.shared.core.chat.messages import ToolCall
from reel.shared.core.mutators import rewind
from reel.shared.core.run import planning as plan
from reel.shared.core.run.events import (
    ARGUMENTS_INLINE_MAX,
    AgentFinished,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    StepsDeclared,
)
from reel.shared.core.run.fold import fold
from reel.shared.core.run.ids import AttemptNo, BranchId, StepId
from reel.shared.core.run.state import INTERRUPTED, step_statuses
from reel.shared.core.run.statecodec import encode_state
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.verify.verifiers import make_ctx
from reel.shared.core.wire.commands import RewindRun
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from tests.unit.agent_sim import Sim, X

MAIN = BranchId("main")


def workflow(turns: list[dict[str, Any]], **agent: Any) -> WorkflowSpec:
    return parse_workflow({"name": "w", "steps": [
        {"kind": "tool", "id": "prep", "tool": {"type": "recorded", "output": "ok"}},
        {"kind": "agent", "id": "solve", "instructions": "Fix it.", "max_attempts": 2,
         "context": [{"id": "task", "kind": "task", "text": "the test fails"}],
         "model": {"adapter": "scripted", "turns": turns},
         "tools": [{"name": "read_file", "parameters": {"type": "object"}, "python": "json:loads"},
                   {"name": "run_tests", "command": ["true"], "retry_safe": True},
                   {"name": "deploy", "command": ["true"], "fatal": True}],
         **agent},
        {"kind": "model", "id": "review", "model": {"adapter": "scripted", "outputs": ["fine"]},
         "context": [{"id": "answer", "from_step": "solve"}]},
    ]})


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "arguments": args}


TWO_TURNS = [{"text": "", "tool_calls": [call("read_file", path="ops.py"), call("run_tests")]},
             {"text": "fixed: use +"}]


def tools(**override: Any) -> dict[str, Any]:
    def failing(_: dict[str, Any]) -> str:
        raise RuntimeError("FAIL: test_add")
    return {"read_file": lambda a: f"contents of {a['path']}", "run_tests": failing, "deploy": lambda a: "ok",
            **override}


def kinds(events: tuple[Any, ...]) -> list[str]:
    return [type(e).__name__ for e in events]


def test_a_two_turn_loop_runs_to_verifying_in_one_commit_per_round_trip() -> None:
    sim = Sim(workflow(TWO_TURNS), tools())
    state = sim.run()
    assert state.status == "verifying"
    assert step_statuses(state, MAIN) == ["succeeded", "succeeded", "succeeded"]
    commits = [c.events for _, c in sim.log]
    agent = [kinds(e) for e in commits if any(getattr(x, "step_id", "").startswith("solve") or
                                            isinstance(x, StepsDeclared) for x in e)]
    assert agent == [
        ["StepsDeclared", "AttemptDispatched"],                                      # turn 1: declared + intent
        ["AttemptSucceeded", "StepsDeclared", "AttemptDispatched", "AttemptDispatched"],  # answer → both calls run
        ["AttemptSucceeded"],                                                        # c0's result
        ["AttemptFailed", "StepsDeclared", "AttemptDispatched"],                     # c1's error + turn 2's intent
        ["AttemptSucceeded", "AgentFinished"],                                       # turn 2 answers: the end
    ]
    # one round trip per step: 5 commits for 2 turns and 2 calls; the whole run
    assert len(sim.log) == 2 + 2 + 5 + 2 + 1  # created, started, prep ×2, agent ×5, review ×2, verifying
    # the error is an observation in turn 2's request, answering the call the model made
    second = sim.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    ids = [c["id"] for c in second[2]["tool_calls"]]
    assert [m["tool_call_id"] for m in second[3:]] == ids and len(set(ids)) == 2
    assert second[4]["content"] == "error (tool_error): FAIL: test_add"
    assert [t["function"]["name"] for t in sim.requests[0]["tools"]] == ["read_file", "run_tests", "deploy"]
    # the agent's output is turn 2's answer, and the next step reads it
    solve = build_episode_view(state).step("solve")
    assert solve.output_ref is not None and b"fixed: use +" in sim.blobs[solve.output_ref.sha256]
    assert plan.succeeded_output(state, MAIN, StepId("solve")) == solve.output_ref
    assert encode_state(state) == encode_state(fold(sim.log))  # refold identical


def test_calls_run_at_most_max_parallel_tools_at_once() -> None:
    three = [{"tool_calls": [call("read_file", path=p) for p in ("a", "b", "c")]}, {"text": "done"}]
    sim = Sim(workflow(three, max_parallel_tools=2), tools())
    peak = 0
    sim.start()
    for _ in range(100):
        assert sim.state is not None
        action = plan.next_action(sim.state, X, sim.in_flight)
        if isinstance(action, plan.Rest | plan.EnterVerifying):
            break
        sim.perform(action)
        peak = max(peak, len(sim.in_flight))
    assert peak == 2
    assert sim.state is not None and step_statuses(sim.state, MAIN)[1] == "succeeded"
    started = [kinds(c.events) for _, c in sim.log
               if any(isinstance(e, AttemptDispatched) and e.step_id.startswith("solve:") for e in c.events)]
    # c2's intent rides in the commit of the first result that frees a slot (one round trip)
    assert started == [["StepsDeclared", "AttemptDispatched"],
                       ["AttemptSucceeded", "StepsDeclared", "AttemptDispatched", "AttemptDispatched"],
                       ["AttemptSucceeded", "AttemptDispatched"],
                       ["AttemptSucceeded", "StepsDeclared", "AttemptDispatched"]]


def test_a_turn_failure_is_retried_then_ends_the_agent() -> None:
    flaky = [{"failures": [{"error": "rate_limited", "message": "429"}], "tool_calls": [call("read_file", path="x")]},
             {"failures": [{"error": "server_error"}, {"error": "server_error"}], "text": "never"}]
    state = Sim(workflow(flaky), tools()).run()
    assert step_statuses(state, MAIN) == ["succeeded", "failed", "skipped"]
    view = build_episode_view(state)
    assert [len(view.step(s).attempts) for s in ("solve:t1", "solve:t2")] == [2, 2]
    assert (view.step("solve").error_kind, view.step("solve").output_ref) == ("turn_failed", None)


def test_max_turns_fails_the_step_and_declares_no_more_calls() -> None:
    loop = [{"tool_calls": [call("read_file", path="x")]}]
    sim = Sim(workflow(loop, max_turns=3), tools())
    state = sim.run()
    assert step_statuses(state, MAIN)[1] == "failed"
    last = sim.log[-2][1].events  # before run_verifying
    assert kinds(last) == ["AttemptSucceeded", "AgentFinished"]
    assert isinstance(last[1], AgentFinished) and (last[1].error_kind, last[1].turns) == ("max_turns", 3)
    assert [s.step_id for s in build_episode_view(state).steps if s.parent_step] == [
        "solve:t1", "solve:t1:c0", "solve:t2", "solve:t2:c0", "solve:t3"]


def test_a_fatal_tool_failure_ends_the_agent_an_ordinary_one_does_not() -> None:
    sim = Sim(workflow([{"tool_calls": [call("deploy")]}, {"text": "x"}]), tools(deploy=tools()["run_tests"]))
    state = sim.run()
    assert step_statuses(state, MAIN) == ["succeeded", "failed", "skipped"]
    assert kinds(sim.log[-2][1].events) == ["AttemptFailed", "AgentFinished"]
    assert build_episode_view(state).step("solve").error_kind == "fatal_tool"


def test_unknown_tools_and_bad_ids_are_observations_not_crashes() -> None:
    turns = [{"tool_calls": [{"name": "teleport", "arguments": "{not json", "id": "dup"},
                             {"name": "read_file", "arguments": {"path": "a"}, "id": "dup"}]}, {"text": "ok"}]
    sim = Sim(workflow(turns), tools())
    state = sim.run()
    assert step_statuses(state, MAIN)[1] == "succeeded"
    second = sim.requests[1]["messages"]
    call_ids = [c["id"] for c in second[2]["tool_calls"]]
    assert call_ids[0] == "dup" and call_ids[1] != "dup"  # a duplicate id is replaced, the first kept unchanged
    assert second[3]["content"].startswith("error (unknown_tool)")


def test_rewind_to_turn_2_calls_the_model_again_on_a_new_branch() -> None:
    sim = Sim(workflow(TWO_TURNS), tools())
    state = sim.run()
    old = build_episode_view(state, MAIN)
    decision = rewind.decide(state, sim.log, RewindRun(run_id=state.run_id, at_step="solve:t2"),
                             branch_id=BranchId("b-1"), at_ms=sim.tick())
    assert isinstance(decision, tuple)
    sim.commit([decision[0]])
    requests_before = len(sim.requests)
    state = sim.run()
    assert state.status == "verifying" and state.active_branch == "b-1"
    assert len(sim.requests) == requests_before + 1  # turn 2 only: turn 1 and its calls are inherited
    assert sim.requests[-1]["messages"] == sim.requests[1]["messages"]
    new = build_episode_view(state, BranchId("b-1"))
    assert [s.step_id for s in new.steps] == [s.step_id for s in old.steps]
    assert build_episode_view(state, MAIN) == msgspec.structs.replace(old, snapshot_lsn=state.head_lsn,
                                                                      status=state.status)


# ---- agent_action and the builders one decision at a time ------------------------------------------------


def _state_after(turns: list[dict[str, Any]], n_actions: int, **agent: Any) -> Sim:
    sim = Sim(workflow(turns, **agent), tools())
    sim.start()
    for _ in range(n_actions):
        assert sim.state is not None
        sim.perform(plan.next_action(sim.state, X, sim.in_flight))
    return sim


def test_orphaned_calls_are_superseded_when_retry_safe_and_resolved_unknown_otherwise() -> None:
    sim = _state_after([{"tool_calls": [call("read_file", path="a"), call("run_tests")]}, {"text": "ok"}], 3)
    assert sim.state is not None and len(sim.in_flight) == 2
    # the executor died: nothing is in flight any more
    action = plan.next_action(sim.state, X, ())
    assert isinstance(action, plan.ResolveUnknown) and [c.step_id for c in action.calls] == ["solve:t1:c0"]
    events = ac.unknown_outcomes(sim.state, action, at_ms=1)
    assert isinstance(events[0], AttemptFailed) and (events[0].error_kind, events[0].retryable) == (
        "outcome_unknown", False)
    sim.in_flight.clear()
    sim.commit(events)
    action = plan.next_action(sim.state, X, ())
    assert action == plan.DispatchCalls(branch_id=MAIN, agent=StepId("solve"),
                                        calls=(plan.CallAttempt(StepId("solve:t1:c1"), AttemptNo(2)),))


def test_a_turn_in_flight_is_waited_for_and_an_orphaned_one_superseded() -> None:
    sim = _state_after(TWO_TURNS, 2)  # claimed, prep done: turn 1 is next
    assert sim.state is not None
    turn = plan.DispatchTurn(branch_id=MAIN, agent=StepId("solve"), step_id=StepId("solve:t1"), turn=1,
                             attempt=AttemptNo(1), declare=True)
    assert plan.next_action(sim.state, X) == turn
    sim.commit(sim.turn_intent(turn, ()))
    assert plan.next_action(sim.state, X, [(MAIN, StepId("solve:t1"), AttemptNo(1))]) == plan.Wait()
    assert plan.next_action(sim.state, X) == msgspec.structs.replace(turn, attempt=AttemptNo(2), declare=False)


def test_a_recovered_turn_success_is_adopted() -> None:
    sim = _state_after(TWO_TURNS, 2)
    assert sim.state is not None
    turn = plan.next_action(sim.state, X)
    assert isinstance(turn, plan.DispatchTurn)
    sim.commit(sim.turn_intent(turn, ()))
    ref = sim.put(msgspec.json.encode({"role": "assistant", "content": None, "tool_calls": [
        {"id": "k1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"a\"}"}}]}))
    sim.commit([AttemptSucceeded(branch_id=MAIN, step_id=StepId("solve:t1"), attempt=AttemptNo(1), output_ref=ref,
                                 at_ms=5, recovered=True)])
    action = plan.next_action(sim.state, X)
    assert action == plan.AdoptTurn(branch_id=MAIN, agent=StepId("solve"), step_id=StepId("solve:t1"), turn=1,
                                    attempt=AttemptNo(1), output_ref=ref)
    state = sim.run()
    assert step_statuses(state, MAIN) == ["succeeded", "succeeded", "succeeded"]


def test_turns_and_calls_interrupted_at_shutdown_are_retried_without_using_up_attempts() -> None:
    sim = _state_after([{"tool_calls": [call("read_file", path="a"), call("run_tests")]}, {"text": "ok"}], 3,
                       max_attempts=1)
    assert sim.state is not None and len(sim.in_flight) == 2
    drained = [AttemptFailed(branch_id=b, step_id=s, attempt=n, error_kind=INTERRUPTED, message="drain deadline",
                             retryable=True, at_ms=3) for b, s, n in sim.in_flight]
    assert not ac.completes_turn(sim.state, drained)  # the turn is not over: its calls run again
    assert [kinds(ac.call_outcome(sim.state, d, at_ms=3)) for d in drained] == [["AttemptFailed"]] * 2
    sim.in_flight.clear()
    sim.commit(drained)
    action = plan.next_action(sim.state, X, ())
    assert isinstance(action, plan.DispatchCalls) and [(c.step_id, c.attempt) for c in action.calls] == [
        ("solve:t1:c0", 2), ("solve:t1:c1", 2)]
    # a turn's attempt, likewise: no agent_finished after its only attempt was interrupted
    sim = _state_after(TWO_TURNS, 2, max_attempts=1)
    assert sim.state is not None
    turn = plan.next_action(sim.state, X)
    assert isinstance(turn, plan.DispatchTurn)
    sim.commit(sim.turn_intent(turn, ()))
    drained_turn = AttemptFailed(branch_id=MAIN, step_id=turn.step_id, attempt=turn.attempt, error_kind=INTERRUPTED,
                                 message="drain deadline", retryable=True, at_ms=4)
    assert kinds(ac.turn_failure(sim.state, drained_turn, at_ms=4)) == ["AttemptFailed"]
    sim.commit([drained_turn])
    assert plan.next_action(sim.state, X) == msgspec.structs.replace(turn, attempt=AttemptNo(2), declare=False)


def test_the_run_waits_for_calls_in_flight_before_verifying() -> None:
    sim = _state_after([{"tool_calls": [call("deploy"), call("read_file", path="a")]}], 3)
    assert sim.state is not None
    bid, sid, n = sim.in_flight[0]
    sim.in_flight.pop(0)
    sim.commit(ac.call_outcome(sim.state, AttemptFailed(branch_id=bid, step_id=sid, attempt=n, error_kind="x",
                                                        message="boom", retryable=False, at_ms=3), at_ms=3))
    assert step_statuses(sim.state, MAIN)[1] == "failed"
    assert plan.next_action(sim.state, X, sim.in_flight) == plan.Wait()
    assert plan.next_action(sim.state, X, ()) == plan.EnterVerifying(MAIN)


def test_call_declarations_carry_the_tools_flags_and_large_arguments_by_reference() -> None:
    agent = workflow(TWO_TURNS).agent("solve")
    big = msgspec.json.encode({"text": "x" * ARGUMENTS_INLINE_MAX}).decode()
    decls, blobs = ac.declare_calls(agent, 3, [ToolCall(id="", name="run_tests", arguments="{}"),
                                               ToolCall(id="a", name="deploy", arguments=big),
                                               ToolCall(id="b", name="nope", arguments="{")])
    assert [(d.step_id, d.call_id, d.retry_safe, d.fatal) for d in decls] == [
        ("solve:t3:c0", "call_t3_0", True, False), ("solve:t3:c1", "a", False, True),
        ("solve:t3:c2", "b", False, False)]
    assert decls[1].arguments is None and decls[1].arguments_ref == ac.json_ref(big.encode()) and blobs == (
        big.encode(),)
    assert decls[2].arguments == "{" and decls[0].arguments == "{}"


class _Blobs:
    def __init__(self, blobs: dict[str, bytes]) -> None:
        self.blobs = blobs

    async def get(self, ref: Any) -> bytes:
        return self.blobs[ref.sha256]


async def test_verifiers_judge_an_agent_steps_output_and_its_turns() -> None:
    spec = parse_workflow({"name": "w", "steps": [workflow(TWO_TURNS).steps[1]]})  # the agent step alone, last
    sim = Sim(spec, tools())
    view = build_episode_view(sim.run())
    assert view.steps[-1].step_id == "solve:t2"
    ctx = make_ctx(view, step=None, blobs=_Blobs(sim.blobs), timeout_s=1)
    assert (ctx.step, ctx.attempt) == ("solve", None)  # the agent step itself, not its last turn
    assert b"fixed: use +" in (await ctx.output() or b"")
    turn = make_ctx(view, step="solve:t1", blobs=_Blobs(sim.blobs), timeout_s=1)
    assert turn.attempt == 1 and b"tool_calls" in (await turn.output() or b"")
