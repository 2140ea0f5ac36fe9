"""``reel lab``'s pure parts: the SPEC, the fork turn and edit chosen per run, the tally of flips and rates."""

from __future__ import annotations

from pathlib import Path

import pytest

from reel.shared.core.lab.labspec import (
    AfterFailingTool,
    FirstDropped,
    ItemEdit,
    ItemOfKind,
    JudgedPoint,
    LabSpecError,
    TurnPoint,
    expand,
    parse_spec,
)
from reel.shared.core.lab.point import Skip, choose_agent, fork_turn, resolve_edit
from reel.shared.core.lab.stats import pass_rate
from reel.shared.core.lab.tally import FAIL, PASS, RunResult, Usage, branch_verdict, judged_by, tally
from reel.shared.core.run.eventfields import ContextPartition, Verdict
from reel.shared.core.run.forkedits import Drop, Instructions, Param, Restore, ToolResult
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ContextItemId, ExecutorId, RunId, StepId
from reel.shared.core.run.state import AttemptStatus, RunStatus, StepStatus
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.core.workflow.spec import AgentStep, ContextItemSpec

SPEC = """
runs: {recordings: "${DATA:-data}", limit: 5}
at: {judged_by: task-in-final-context}
edit: {drop: {kind: task}}
verifier: task-in-final-context
"""


def _parse(text: str, tmp_path: Path, **env: str) -> object:
    return parse_spec(text, folder=tmp_path, env=env, name="t")


def test_a_spec_parses_to_its_runs_point_edit_and_verifier(tmp_path: Path) -> None:
    spec = parse_spec(SPEC, folder=tmp_path, env={}, name="drop_task")
    assert spec.name == "drop_task" and spec.runs.recordings == tmp_path / "data" and spec.runs.limit == 5
    assert spec.at == JudgedPoint(verifier="task-in-final-context")
    assert spec.edit == ItemEdit(op="drop", item=ItemOfKind(kind="task"))
    assert spec.verifiers == ("task-in-final-context",) and spec.branch is None
    assert parse_spec(SPEC, folder=tmp_path, env={"DATA": "/d"}).runs.recordings == Path("/d")  # absolute stays


def test_every_point_and_edit_of_the_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "inst.txt").write_text("be brief")
    (tmp_path / "res.txt").write_text("ok")
    base = "runs: {ids: [r-1, r-2]}\n"
    points = {"{turn: 2}": TurnPoint(turn=2), "{turn: last}": TurnPoint(turn=-1), "{turn: -2}": TurnPoint(turn=-2),
              "{after_first_failing_tool: true}": AfterFailingTool(),
              "{first_dropped: old-notes}": FirstDropped(item="old-notes"),
              "{first_dropped: {kind: demo}}": FirstDropped(item=ItemOfKind(kind="demo"))}
    for text, want in points.items():
        assert parse_spec(base + f"at: {text}\nedit: {{restore: x}}\n", folder=tmp_path, env={}).at == want
    edits = {"{restore: old-notes}": ItemEdit(op="restore", item="old-notes"),
             "{instructions: inst.txt}": Instructions(text="be brief"),
             "{param: {temperature: 0.2}}": Param(key="temperature", value=0.2),
             "{tool_result: {call: 'fix:t1:c0', file: res.txt}}": ToolResult(call=StepId("fix:t1:c0"), text="ok"),
             "{tool_result: {call: 'fix:t1:c0', text: fine}}": ToolResult(call=StepId("fix:t1:c0"), text="fine")}
    for text, want_edit in edits.items():
        spec = parse_spec(base + f"at: {{turn: 1}}\nedit: {text}\n", folder=tmp_path, env={})
        assert spec.edit == want_edit and spec.runs.ids == ("r-1", "r-2")
    labelled = parse_spec("runs: {label: replayed_from=x.json}\nat: {turn: 1}\nedit: {model: m}\nverifier: [a, b]",
                          folder=tmp_path, env={})
    assert labelled.runs.label == ("replayed_from", "x.json") and labelled.verifiers == ("a", "b")


@pytest.mark.parametrize(("text", "says"), [
    ("- a list", "a mapping"),
    ("runs: {ids: [r]}\nat: {turn: 1}\n", "`edit`"),
    ("runs: {ids: [r], label: x}\nat: {turn: 1}\nedit: {model: m}", "exactly one of ids, label, recordings"),
    ("runs: {ids: [r]}\nat: {turn: 1, judged_by: v}\nedit: {model: m}", "exactly one of turn, judged_by"),
    ("runs: {ids: [r]}\nat: {turn: 0}\nedit: {model: m}", "at.turn is a turn number"),
    ("runs: {ids: [r]}\nat: {turn: first}\nedit: {model: m}", "at.turn is a turn number"),
    ("runs: {ids: [r]}\nat: {turn: 1}\nedit: {model: m, drop: x}", "exactly one of restore, drop"),
    ("runs: {ids: [r]}\nat: {turn: 1}\nedit: {param: {a: 1, b: 2}}", "one KEY: VALUE pair"),
    ("runs: {ids: [r]}\nat: {turn: 1}\nedit: {instructions: nope.txt}", "cannot read instructions file"),
    ("runs: {ids: [r]}\nat: {turn: 1}\nedit: {model: m}\ncolour: red", "unknown field `colour`"),
    ("runs: {recordings: $NOPE}\nat: {turn: 1}\nedit: {model: m}", "$NOPE is not set"),
    ("runs: {ids: [r]}\nat: {turn: 1}\nedit: {model: m", "not YAML"),
])
def test_a_bad_spec_is_one_error_saying_what_and_where(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(LabSpecError) as info:
        parse_spec(text, folder=tmp_path, env={})
    assert says in info.value.message and "\n" not in info.value.message


def test_expand_takes_the_environment_given() -> None:
    assert expand("$A/${B}/${C:-c}/${A:-z}", {"A": "a", "B": "b"}) == "a/b/c/a"
    assert expand("${E:-d}", {"E": ""}) == "d"


def _part(*packed: str, dropped: tuple[str, ...] = ()) -> ContextPartition:
    return ContextPartition(packed=tuple(map(ContextItemId, packed)), available=(),
                            dropped=tuple(map(ContextItemId, dropped)))


def _attempt(step: str, part: ContextPartition | None = None) -> AttemptView:
    return AttemptView(step_id=StepId(step), attempt=AttemptNo(1), status=AttemptStatus.SUCCEEDED,
                       executor_id=ExecutorId("x"), dispatched_lsn=LSN(1), context=part)


def _view(turns: dict[int, ContextPartition], failing: tuple[str, ...] = (),
          verdicts: tuple[tuple[str, str], ...] = ()) -> EpisodeView:
    steps = [StepView(step_id=StepId("fix"), kind="agent", status=StepStatus.SUCCEEDED)]
    for t, part in turns.items():
        steps.append(StepView(step_id=StepId(f"fix:t{t}"), kind="model", status=StepStatus.SUCCEEDED,
                              attempts=(_attempt(f"fix:t{t}", part),), parent_step=StepId("fix"), turn=t))
        call = f"fix:t{t}:c0"
        steps.append(StepView(step_id=StepId(call), kind="tool", status=StepStatus.SUCCEEDED,
                              attempts=(_attempt(call),), parent_step=StepId("fix"), turn=t,
                              is_error=call in failing))
    return EpisodeView(run_id=RunId("r"), workflow_name="w", branch_id=BranchId("main"), snapshot_lsn=LSN(9),
                       status=RunStatus.COMPLETED, lineage=(), steps=tuple(steps),
                       verdicts=tuple(Verdict(run_id=RunId("r"), branch_id=BranchId("main"), snapshot_lsn=LSN(9),
                                              verifier=v, step_id=StepId(s), status="pass") for v, s in verdicts))


AGENT = AgentStep(id="fix", model=ModelSpec(adapter="replay", model="m"), context=(
    ContextItemSpec(id="m0001", text="the issue", kind="task"), ContextItemSpec(id="d1", text="x", kind="demo"),
    ContextItemSpec(id="d2", text="y", kind="demo")))


def test_the_fork_turn_of_each_point() -> None:
    view = _view({1: _part("task"), 2: _part("task", dropped=("old",)), 3: _part("task", dropped=("old",))},
                 failing=("fix:t2:c0", "fix:t3:c0"), verdicts=(("ctx", "fix:t3"), ("ctx", "fix:t2")))
    agent = StepId("fix")
    assert choose_agent(view, None) == agent and isinstance(choose_agent(view, "other"), Skip)
    assert fork_turn(view, agent, TurnPoint(turn=2), AGENT) == "fix:t2"
    assert fork_turn(view, agent, TurnPoint(turn=-1), AGENT) == "fix:t3"
    assert fork_turn(view, agent, TurnPoint(turn=-3), AGENT) == "fix:t1"
    assert fork_turn(view, agent, TurnPoint(turn=4), AGENT) == Skip("no turn 4 (the agent ran 3)")
    assert fork_turn(view, agent, TurnPoint(turn=-4), AGENT) == Skip("no turn -4 (the agent ran 3)")
    assert fork_turn(view, agent, JudgedPoint(verifier="ctx"), AGENT) == "fix:t2"  # the latest verdict's turn
    assert fork_turn(view, agent, JudgedPoint(verifier="other"), AGENT) == Skip("no verdict of other on main")
    assert fork_turn(view, agent, AfterFailingTool(), AGENT) == "fix:t3"  # t2's call failed first
    assert fork_turn(view, agent, FirstDropped(item="old"), AGENT) == "fix:t2"
    assert fork_turn(view, agent, FirstDropped(item="task"), AGENT) == Skip("no turn dropped task")
    assert fork_turn(view, agent, FirstDropped(item=ItemOfKind(kind="demo")), AGENT) == Skip(
        "2 context items of kind demo (d1, d2)")
    last_fails = _view({1: _part("task"), 2: _part("task")}, failing=("fix:t2:c0",))
    assert fork_turn(last_fails, agent, AfterFailingTool(), AGENT) == Skip("fix:t2:c0 failed in the agent's last turn")
    assert fork_turn(_view({1: _part("task")}), agent, AfterFailingTool(), AGENT) == Skip("no tool call failed")


def test_an_item_of_a_kind_becomes_the_runs_item() -> None:
    assert resolve_edit(ItemEdit(op="drop", item=ItemOfKind(kind="task")), AGENT) == Drop(item=ContextItemId("m0001"))
    assert resolve_edit(ItemEdit(op="restore", item="old"), None) == Restore(item=ContextItemId("old"))
    assert resolve_edit(ItemEdit(op="drop", item=ItemOfKind(kind="task")), None) == Skip(
        "the workflow could not be read: the task item is unknown")
    assert resolve_edit(Param(key="k", value=1), AGENT) == Param(key="k", value=1)


def test_a_branch_passes_when_every_judging_verifier_passes() -> None:
    assert branch_verdict({"a": "pass", "b": "pass", "c": "fail"}, ("a", "b")) == PASS
    assert branch_verdict({"a": "pass", "b": "error"}, ("a", "b")) == FAIL
    assert branch_verdict({"a": "pass"}, ("a", "b")) == Skip("no verdict of b")
    assert judged_by((), ("a", "b")) == ("a", "b") and judged_by(("b",), ("a", "b")) == ("b",)
    assert judged_by(("z",), ("a",)) == Skip("the run has no verifier z (it has a)")
    assert judged_by((), ()) == Skip("the run has no verifier")


def _r(run: str, before: str | None, after: str | None, skipped: str | None = None, tokens: int = 10) -> RunResult:
    return RunResult(run_id=run, source=f"{run}.json", base_branch="main", branch_id=f"b-{run}", at_step="a:t1",
                     before=before, after=after, skipped=skipped, before_usage=Usage(input_tokens=tokens),
                     after_usage=Usage(input_tokens=tokens - 1, cost_usd=0.5))


def test_tally_counts_paired_runs_and_lists_flips_both_ways() -> None:
    results = [_r("r1", PASS, FAIL), _r("r2", PASS, PASS), _r("r3", FAIL, PASS), _r("r4", FAIL, FAIL),
               _r("r5", PASS, FAIL), _r("r6", PASS, None, skipped="fork refused: invalid_edit: …"),
               RunResult(run_id="r7", source="r7.json", skipped="no turn 3 (the agent ran 2)")]
    rep = tally(results, name="lab", point="turn 1", edit="drop x", verifiers=("v",), wall_s=1.23456)
    assert (rep.runs, rep.counted) == (7, 5)
    assert rep.before == pass_rate(3, 5) and rep.after == pass_rate(2, 5)  # the same five runs on both sides
    assert [(f.run_id, f.branch_id) for f in rep.pass_to_fail] == [("r1", "b-r1"), ("r5", "b-r5")]
    assert [(f.run_id, f.branch_id) for f in rep.fail_to_pass] == [("r3", "b-r3")]
    assert [(s.run_id, s.reason) for s in rep.skipped] == [("r6", "fork refused: invalid_edit: …"),
                                                         ("r7", "no turn 3 (the agent ran 2)")]
    assert rep.before_usage == Usage(input_tokens=50) and rep.after_usage == Usage(input_tokens=45, cost_usd=2.5)
    assert rep.wall_s == 1.235 and len(rep.results) == 7
    empty = tally([], name="lab", point="p", edit="e", verifiers=())
    assert empty.before.runs == 0 and empty.before.render() == "0/0 = – [0.0–100.0 %]"
