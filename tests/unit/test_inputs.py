"""Human input through the pure core: requests committed with the turn's answer, the
run resting in ``awaiting_input``, answers in any order, edited arguments, rejections and answers as observations,
deadlines, cancel and rewind — driven by the reference driver (tests/unit/agent_sim.py), no server."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from reel.shared.core.decision import Skip
from reel.shared.core.errors import InvalidCommand, InvalidTransition, WorkflowInvalid
from reel.shared.core.input import requestfold, respond
from reel.shared.core.mutators import rewind
from reel.shared.core.run import planning as plan
from reel.shared.core.run.events import (
    AttemptDispatched,
    Commit,
    InputAnswered,
    InputRequested,
    RunAwaitingInput,
    RunCancelled,
    StepsDeclared,
)
from reel.shared.core.run.fold import apply_commit, fold
from reel.shared.core.run.ids import BranchId, RequestId, RunId, StepId, request_id_for
from reel.shared.core.run.state import RunState
from reel.shared.core.run.statecodec import encode_state
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.wire.commands import RespondRun, RewindRun
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from tests.unit.agent_sim import Sim

MAIN = BranchId("main")
WRITE = {"name": "write_file", "python": "json:dumps", "needs_approval": True,
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                        "required": ["path"]}}
ASK = {"name": "ask_user", "builtin": "ask_user", "input": {"ask": "the requester"}}


def workflow(turns: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **top: Any) -> WorkflowSpec:
    return parse_workflow({"name": "hitl", **top, "steps": [{
        "kind": "agent", "id": "solve", "instructions": "Do it.", "max_parallel_tools": 4,
        "context": [{"id": "task", "kind": "task", "text": "write two files"}],
        "model": {"adapter": "scripted", "turns": turns},
        "tools": tools if tools is not None else [WRITE, {"name": "read_file", "python": "json:loads"}, ASK]}]})


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "arguments": args}


def written(args: dict[str, Any]) -> str:
    return f"wrote {args['path']}: {args.get('text', '')}"


TOOLS = {"write_file": written, "read_file": lambda a: "contents"}
TWO_WRITES = [{"text": "", "tool_calls": [call("write_file", path="a.txt", text="A"), call("read_file"),
                                          call("write_file", path="b.txt", text="B")]},
              {"text": "done"}]


def answer(sim: Sim, request_id: str, decision: str, **kw: Any) -> InputAnswered | Skip:
    assert sim.state is not None
    out = respond.decide(sim.state, RespondRun(run_id=sim.run_id, request_id=request_id, decision=decision,  # type: ignore[arg-type]
                                               **kw), sim.spec, at_ms=sim.tick())
    if isinstance(out, Skip):
        return out
    sim.commit(list(out))
    [event] = out
    assert isinstance(event, InputAnswered)
    return event


def requests(state: RunState) -> list[str]:
    return [r.request_id for r in requestfold.open_requests(state.active)]


def test_two_calls_needing_approval_ask_while_the_third_runs_then_the_run_rests() -> None:
    sim = Sim(workflow(TWO_WRITES), TOOLS)
    state = sim.run()
    assert state.status == "awaiting_input"
    turn_answer = next(c.events for _, c in sim.log if any(isinstance(e, InputRequested) for e in c.events))
    assert [type(e).__name__ for e in turn_answer] == [
        "AttemptSucceeded", "StepsDeclared", "InputRequested", "InputRequested", "AttemptDispatched"]
    asked = [e for e in turn_answer if isinstance(e, InputRequested)]
    assert [(e.step_id, e.kind, e.tool_name) for e in asked] == [("solve:t1:c0", "approval", "write_file"),
                                                                ("solve:t1:c2", "approval", "write_file")]
    assert [e.request_id for e in asked] == [request_id_for(sim.run_id, MAIN, s) for s in ("solve:t1:c0",
                                                                                           "solve:t1:c2")]
    assert isinstance(sim.log[-1][1].events[-1], RunAwaitingInput)  # after read_file finished: nothing else runs
    assert state.branches[MAIN].attempts.get(StepId("solve:t1:c1"))  # the plain call ran meanwhile
    assert not state.branches[MAIN].attempts.get(StepId("solve:t1:c0"))
    view = build_episode_view(state)
    assert [(s.step_id, s.status) for s, _ in view.requests()] == [("solve:t1:c0", "awaiting_input"),
                                                                   ("solve:t1:c2", "awaiting_input")]
    assert plan.next_action(state, "x-sim") == plan.Rest(state.status)


def test_answers_in_any_order_edited_arguments_and_a_rejection_the_model_reads() -> None:
    sim = Sim(workflow(TWO_WRITES), TOOLS)
    first, second = requests(sim.run())
    done = answer(sim, second, "approve", arguments={"path": "b2.txt", "text": "edited"}, by="ana")
    assert isinstance(done, InputAnswered) and done.arguments == '{"path":"b2.txt","text":"edited"}'
    assert sim.state is not None and sim.state.status == "running"  # the answer wakes the run
    state = sim.run()
    assert state.status == "awaiting_input" and requests(state) == [first]  # the other still waits
    assert answer(sim, first, "reject", note="a.txt is read-only") is not None
    state = sim.run()
    assert state.status == "verifying"
    obs = sim.requests[-1]["messages"][3:]  # turn 2: system, user, assistant, then the three results
    assert [m["content"] for m in obs] == [
        "error (rejected): the approver rejected this call: a.txt is read-only", "contents",
        '(approved with edited arguments: {"path":"b2.txt","text":"edited"})\nwrote b2.txt: edited']
    view = build_episode_view(state)
    by_step = {s.step_id: (s.status, s.is_error, r.status) for s, r in view.requests()}
    assert by_step == {"solve:t1:c0": ("failed", True, "rejected"), "solve:t1:c2": ("succeeded", False, "approved")}
    assert fold(sim.log) == state  # a cold refold says the same


def test_duplicates_late_unknown_and_already_answered_are_told_apart() -> None:
    sim = Sim(workflow(TWO_WRITES), TOOLS)
    first, _ = requests(sim.run())
    assert isinstance(answer(sim, first, "approve"), InputAnswered)
    again = answer(sim, first, "approve")
    assert isinstance(again, Skip) and again.reason.startswith("duplicate")
    with pytest.raises(respond.RequestAnswered, match="already answered: approve"):
        answer(sim, first, "reject", note="changed my mind")
    with pytest.raises(respond.RequestNotFound, match="no input request 'q-nope'") as e:
        answer(sim, "q-nope", "approve")
    assert e.value.code == "request_not_found"
    with pytest.raises(InvalidCommand, match=r"takes approve or reject, not 'answer' \(at `\$.decision`\)"):
        answer(sim, requests(sim.state)[0], "answer", text="42")  # type: ignore[arg-type]
    with pytest.raises(InvalidCommand, match=r"'path' is a required property \(at `\$.arguments`\)"):
        answer(sim, requests(sim.state)[0], "approve", arguments={"text": "no path"})  # type: ignore[arg-type]
    with pytest.raises(InvalidCommand, match=r"approve takes no `note`"):
        answer(sim, requests(sim.state)[0], "approve", note="?")  # type: ignore[arg-type]


def test_ask_user_asks_a_question_and_the_answer_is_the_observation() -> None:
    sim = Sim(workflow([{"tool_calls": [call("ask_user", question="Which branch?")]}, {"text": "ok"}]), TOOLS)
    state = sim.run()
    (rec,) = requestfold.open_requests(state.branches[MAIN])
    assert (rec.kind, rec.question, rec.asked) == ("question", "Which branch?", "the requester")
    assert sim.requests[0]["tools"][2]["function"]["parameters"]["required"] == ["question"]
    with pytest.raises(InvalidCommand, match="takes answer or reject"):
        answer(sim, rec.request_id, "approve")
    answer(sim, rec.request_id, "answer", text="release-2")
    assert sim.run().status == "verifying"
    assert sim.requests[-1]["messages"][-1] == {"role": "tool", "content": "release-2", "tool_call_id": "call_t1_0"}


def test_a_deadline_commits_its_default_once() -> None:
    tools = [{**WRITE, "input": {"ask": "ops", "timeout_s": 60, "default": "reject", "note": "nobody was around"}}]
    sim = Sim(workflow([{"tool_calls": [call("write_file", path="a")]}, {"text": "gave up"}], tools), TOOLS)
    state = sim.run()
    (rec,) = requestfold.open_requests(state.branches[MAIN])
    assert rec.deadline_ms is not None and respond.earliest_deadline(state.branches[MAIN]) == rec.deadline_ms
    assert respond.deadline_events(state, rec.deadline_ms - 1) == Skip("no deadline due")
    fired = respond.deadline_events(state, rec.deadline_ms)
    assert [(e.decision, e.note, e.source) for e in fired] == [("reject", "nobody was around", "deadline")]
    sim.commit(list(fired))
    assert respond.deadline_events(sim.state, rec.deadline_ms + 10) == Skip("no deadline due")  # type: ignore[arg-type]
    late = answer(sim, rec.request_id, "approve")
    assert isinstance(late, Skip) and late.reason.startswith("late")
    assert sim.run().status == "verifying"
    assert sim.requests[-1]["messages"][-1]["content"] == ("error (rejected): nobody answered before the deadline;"
                                                           " rejected by default: nobody was around")


def test_cancel_closes_the_open_requests_and_an_answer_after_it_is_a_no_op() -> None:
    sim = Sim(workflow(TWO_WRITES), TOOLS)
    first, second = requests(sim.run())
    answer(sim, first, "approve")
    state = sim.commit([RunCancelled(reason="stop", at_ms=sim.tick())])
    recs = requestfold.requests_of(state.branches[MAIN])
    assert {r.request_id: (r.status, r.closed_lsn) for r in recs.values()} == {
        first: ("approved", None), second: ("closed", state.head_lsn)}
    late = answer(sim, second, "approve")
    assert isinstance(late, Skip) and "cancelled" in late.reason


def test_a_rewind_from_awaiting_input_keeps_the_open_request_and_drops_a_later_answer() -> None:
    sim = Sim(workflow(TWO_WRITES), TOOLS)
    first, second = requests(sim.run())
    waiting_lsn = sim.log[-1][0]
    answer(sim, first, "reject", note="no")
    decision = rewind.decide(sim.state, sim.log, RewindRun(run_id=sim.run_id, at_lsn=waiting_lsn),  # type: ignore[arg-type]
                             branch_id=BranchId("b-1"), at_ms=sim.tick())
    assert isinstance(decision, tuple)
    state = sim.commit([decision[0]])
    assert requests(state) == [first, second]  # inherited open: the answer came after the fork point
    assert isinstance(answer(sim, first, "approve"), InputAnswered)  # same id, on the active branch
    from_call = rewind.decide(sim.state, sim.log, RewindRun(run_id=sim.run_id, at_step="solve:t1:c0"),  # type: ignore[arg-type]
                              branch_id=BranchId("b-2"), at_ms=sim.tick())
    assert isinstance(from_call, tuple)
    sim.commit([from_call[0]])
    moved = answer(sim, second, "approve")  # c2's request stayed on b-1, which the rewind left
    assert isinstance(moved, Skip) and "which a rewind left" in moved.reason
    state = sim.run()  # the turn's calls are declared again on b-2, with new requests
    assert state.status == "awaiting_input" and set(requests(state)).isdisjoint({first, second})


def test_the_workflow_policy_names_tools_by_pattern_and_invalid_arguments_ask_nobody() -> None:
    tools = [{"name": "deploy_prod", "python": "json:dumps"}, {"name": "read_file", "python": "json:loads",
             "parameters": {"type": "object", "required": ["path"]}, "needs_approval": True}]
    spec = workflow([{"tool_calls": [call("deploy_prod"), call("read_file")]}, {"text": "ok"}], tools,
                    approval={"tools": ["deploy_*"], "ask": "release managers", "timeout_s": 5, "default": "approve"})
    sim = Sim(spec, {"deploy_prod": lambda a: "deployed", "read_file": lambda a: "x"})
    state = sim.run()
    (rec,) = requestfold.open_requests(state.branches[MAIN])  # read_file's call lacks `path`: it runs (and fails)
    assert (rec.step_id, rec.asked, rec.default) == ("solve:t1:c0", "release managers", "approve")
    assert state.branches[MAIN].attempts.get(StepId("solve:t1:c1"))


@pytest.mark.parametrize(("tool", "needle"), [
    ({**ASK, "parameters": {"type": "object"}}, "builtin ask_user takes no"),
    ({**ASK, "input": {"default": "approve"}}, "question's default must be answer or reject"),
    ({**WRITE, "input": {"default": "answer"}}, "approval's default must be approve or reject"),
    ({**WRITE, "input": {"timeout_s": 0}}, "timeout_s must be > 0"),
])
def test_input_specs_are_checked_when_the_workflow_loads(tool: dict[str, Any], needle: str) -> None:
    with pytest.raises(WorkflowInvalid, match=needle):
        workflow([{"text": "x"}], [tool])


# ---- fold cases ------------------------------------------------------------------------------------------------
def _requested(step: str, request: str = "q-1") -> InputRequested:
    return InputRequested(branch_id=MAIN, request_id=RequestId(request), step_id=StepId(step), kind="approval",
                          tool_name="write_file", at_ms=9)


def _apply(state: RunState, *events: Any) -> RunState:
    return apply_commit(state, state.head_lsn + 1, Commit(commit_id="c", run_id=RunId("r-sim"), events=events))


def test_the_fold_refuses_impossible_input_events() -> None:
    sim = Sim(workflow(TWO_WRITES), TOOLS)
    state = sim.run()
    with pytest.raises(InvalidTransition, match="not a declared tool call"):
        _apply(state, _requested("solve:t1"))
    with pytest.raises(InvalidTransition, match="already ran"):
        _apply(state, _requested("solve:t1:c1"))
    with pytest.raises(InvalidTransition, match="already has a request"):
        _apply(state, _requested("solve:t1:c0", "q-2"))
    first = requests(state)[0]
    ok = InputAnswered(branch_id=MAIN, request_id=RequestId(first), step_id=StepId("solve:t1:c0"), decision="approve",
                       at_ms=10)
    with pytest.raises(InvalidTransition, match="which is approved"):
        _apply(_apply(state, ok), ok)
    with pytest.raises(InvalidTransition, match="not a request of that call"):
        _apply(state, msgspec.structs.replace(ok, request_id=RequestId("q-x")))
    with pytest.raises(InvalidTransition, match="run_awaiting_input on a cancelled run"):
        _apply(state, RunCancelled(at_ms=11), RunAwaitingInput(branch_id=MAIN, at_ms=12))


def test_an_answer_wakes_only_a_waiting_run_and_the_encoding_of_older_states_is_unchanged() -> None:
    sim = Sim(workflow([{"text": "no tools"}]), TOOLS)
    state = sim.run()
    assert b'"requests"' not in encode_state(state)  # a branch without requests encodes as before
    sim2 = Sim(workflow(TWO_WRITES), TOOLS)
    waiting = sim2.run()
    first = requests(waiting)[0]
    running = _apply(waiting, InputAnswered(branch_id=MAIN, request_id=RequestId(first),
                                            step_id=StepId("solve:t1:c0"), decision="approve", at_ms=20))
    assert (waiting.status, running.status) == ("awaiting_input", "running")
    assert json.loads(encode_state(running))["branches"]["main"]["requests"]["solve:t1:c0"]["response"][
        "decision"] == "approve"
    assert not any(isinstance(e, AttemptDispatched) and e.step_id == "solve:t1:c0" for _, c in sim2.log
                   for e in c.events)
    assert any(isinstance(e, StepsDeclared) for _, c in sim2.log for e in c.events)
