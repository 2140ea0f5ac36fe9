"""``reel chaos``'s pure core (shared/core/run/crashpoints.py): crash point names, the points of a reference log, end
states,
and the per-tool report that names a tool which ran twice without being retry-safe."""

from __future__ import annotations

from reel.shared.core.run import crashpoints as core
from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    RunStarted,
    RunVerifying,
)
from reel.shared.core.run.ids import BranchId, StepId
from reel.shared.core.workflow.spec import parse_workflow
from tests.golden.regen import GOLDEN_DIR, fold_log

REF = BlobRef(sha256="0" * 64, size_bytes=1)
B = BranchId("main")


def _intent(step: str, n: int = 1) -> AttemptDispatched:
    return AttemptDispatched(branch_id=B, step_id=StepId(step), attempt=n, executor_id="x-1", at_ms=1)


def _ok(step: str, n: int = 1, *, recovered: bool = False) -> AttemptSucceeded:
    return AttemptSucceeded(branch_id=B, step_id=StepId(step), attempt=n, output_ref=REF, at_ms=2, recovered=recovered)


def test_a_commit_names_its_boundaries_for_every_intent_and_outcome_in_it() -> None:
    pts = core.commit_points([_ok("a:t1"), _intent("a:t1:c0"), _intent("a:t1:c1")])
    assert pts.before_intent == ("a:t1:c0:1:before_intent", "a:t1:c1:1:before_intent")
    assert pts.after_output == ("a:t1:1:after_output",)
    assert pts.after_commit == ("a:t1:1:after_outcome", "a:t1:c0:1:after_intent", "a:t1:c1:1:after_intent")
    assert core.commit_points([RunStarted(executor_id="x-1", at_ms=1)]) == core.CommitPoints()


def test_the_points_of_a_reference_log_are_one_per_boundary_in_log_order() -> None:
    commits = [
        [RunStarted(executor_id="x-1", at_ms=1), _intent("s1")],
        [_ok("s1"), _intent("s2")],
        [AttemptFailed(branch_id=B, step_id=StepId("s2"), attempt=1, error_kind="exit_1", message="", retryable=True,
                       at_ms=3), _intent("s2", 2)],
        [_ok("s2", 2), _ok("s1", 9, recovered=True)],  # a recovered outcome is no boundary of this run
        [RunVerifying(branch_id=B, at_ms=4)],
    ]
    assert core.crash_points(commits, side_effects={"s2"}) == (
        "s1:1:before_intent", "s1:1:after_intent",
        "s2:1:before_intent", "s1:1:after_output", "s1:1:after_outcome",  # s1 is a model step: no after_run
        "s2:1:after_run", "s2:2:before_intent", "s2:1:after_output", "s2:1:after_outcome",
        "s2:2:after_run", "s2:2:after_output", "s2:2:after_outcome",
        core.VERIFYING_POINT)


def test_an_end_state_keeps_statuses_outputs_and_verdicts_not_lsns_or_executors() -> None:
    _, views = fold_log(GOLDEN_DIR / "recorded_linear.jsonl")
    view = views[0]
    state = core.end_state(view)
    assert state["status"] == str(view.status)
    assert all(f"{s.step_id}.status" in state and f"{s.step_id}.output" in state for s in view.steps)
    assert not any("lsn" in k or "executor" in k for k in state)
    moved = {**state, "status": "cancelled"}
    assert core.differences(state, moved) == (f"status: {state['status']} ≠ cancelled",)
    assert core.differences(state, moved, masked={"status"}) == ()
    assert core.nondeterministic([state, moved, state]) == {"status"}


SPEC = parse_workflow({"name": "w", "steps": [
    {"kind": "tool", "id": "note", "tool": {"type": "command", "argv": ["true"], "retry_safe": True}},
    {"kind": "tool", "id": "append", "tool": {"type": "command", "argv": ["true"]}},
    {"kind": "tool", "id": "canned", "tool": {"type": "recorded", "output": "x"}},
    {"kind": "agent", "id": "fix", "model": {"adapter": "scripted", "turns": [{"text": "done"}]},
     "context": [{"id": "task", "kind": "task", "text": "t"}], "tools": [
        {"name": "look", "python": "os.path:exists"},
        {"name": "poke", "command": ["true"]}]},
]})


def _effect(run: str, step: str, n: int = 1, tool: str = "") -> core.SideEffect:
    return core.SideEffect(kind="process", run_id=run, step_id=step, attempt=n, tool=tool)


def test_tools_with_side_effects_and_how_they_may_repeat() -> None:
    tools = core.tools_of(SPEC, keyed={("fix", "look")})
    assert [(t.label, t.kind, t.safety, t.agent) for t in tools] == [
        ("note", "command", "retry-safe", ""), ("append", "command", "no", ""),
        ("look", "python", "keyed", "fix"), ("poke", "command", "no", "fix")]


def test_the_report_names_the_tool_that_ran_twice_without_being_retry_safe() -> None:
    tools = core.tools_of(SPEC, keyed={("fix", "look")})
    same = {"status": "completed"}
    refs = [core.ChaosRun(point="", run_id="r0", state=same), core.ChaosRun(point="", run_id="r1", state=same)]
    killed = [core.ChaosRun(point="append:1:after_run", run_id="k1", reached=True, state=same),
              core.ChaosRun(point="note:1:after_run", run_id="k2", reached=True, state=same),
              core.ChaosRun(point="fix:t1:c0:1:after_run", run_id="k3", reached=True, state=same),
              core.ChaosRun(point="x:1:after_intent", run_id="k4", reached=False, state={"status": "cancelled"})]
    base = [("note", ""), ("append", ""), ("fix:t1:c0", "look"), ("fix:t1:c1", "poke")]
    effects = [_effect(r, s, tool=t) for r in ("r0", "r1", "k1", "k2", "k3", "k4") for s, t in base]
    effects += [_effect("k1", "append", 2), _effect("k2", "note", 2), _effect("k3", "fix:t1:c0", 2, "look")]
    rep = core.report(tools, refs, killed, effects)
    rows = {r.tool.label: r for r in rep.rows}
    assert (rows["append"].runs, rows["append"].expected, rows["append"].repeated_at) == (5, 4, ("append:1:after_run",))
    assert rows["append"].verdict == "RAN TWICE" and not rows["append"].ok
    assert rows["note"].verdict == "repeated (retry-safe)" and rows["look"].verdict == "repeated (keyed)"
    assert rows["poke"].verdict == "exactly once"
    assert rep.differing == {"x:1:after_intent": ("status: completed ≠ cancelled",)}
    assert rep.unreached == ("x:1:after_intent",) and not rep.ok
