"""The run budget's pure core: spend as a fold of recorded usage (each attempt once across branches, estimated usage
labelled), the worst case of a model call, the check, and the halt that ends a plain step."""

from __future__ import annotations

import io

import msgspec
import pytest
from rich.console import Console

from reel.services.timeline.render import event_line, timeline
from reel.shared.core.errors import InvalidTransition
from reel.shared.core.run import budget
from reel.shared.core.run.events import (
    AttemptSucceeded,
    BranchForked,
    Budget,
    RunCreated,
    RunStarted,
    StepDecl,
    StepHalted,
    Usage,
)
from reel.shared.core.run.planning import EnterVerifying, next_action
from reel.shared.core.run.state import StepStatus, step_statuses
from reel.shared.core.workflow.prices import PRICES, price_for, priced
from reel.shared.core.workflow.spec import ModelSpec, Price, WorkflowInvalid, parse_workflow
from tests.golden.regen import GOLDEN_DIR, fold_log
from tests.unit.test_fold import OUT, REF, Log, dispatched

USAGE = Usage(input_tokens=1000, output_tokens=100, cost_usd=0.001, source="reported")
ESTIMATED = Usage(input_tokens=50, output_tokens=10, cost_usd=0.0001, source="estimated")


def _log(b: Budget | msgspec.UnsetType = Budget(max_cost_usd=0.01, max_tokens=5000, max_tool_calls=2,
                                                 max_wall_s=60.0)) -> Log:
    log = Log()
    log.add(RunCreated(run_id="r-1", branch_id="main", workflow_name="w", workflow_ref=REF, created_ms=1000, budget=b,
                       steps=(StepDecl(step_id="think", kind="model", max_attempts=2),
                              StepDecl(step_id="fetch", kind="tool"), StepDecl(step_id="say", kind="model"))))
    log.add(RunStarted(executor_id="x-1", at_ms=1500), dispatched("think", 1))
    log.add(AttemptSucceeded(branch_id="main", step_id="think", attempt=1, output_ref=OUT, usage=USAGE, at_ms=3000))
    return log


def test_spend_sums_model_usage_and_counts_tool_attempts() -> None:
    log = _log()
    log.add(dispatched("fetch", 1))
    s = budget.spend(log.state(), now_ms=11_000)
    assert (s.tokens, s.cost_usd, s.tool_calls, s.model_calls, s.wall_s) == (1100, 0.001, 1, 1, 10.0)
    assert s.estimated_tokens == 0


def test_a_forks_inherited_attempts_are_counted_once() -> None:
    log = _log()
    fork = log.add(dispatched("fetch", 1))
    log.add(BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=fork, at_ms=4000))
    log.add(dispatched("fetch", 2, branch="b-1"))
    s = budget.spend(log.state(), now_ms=5000)
    assert (s.tokens, s.cost_usd, s.tool_calls) == (1100, 0.001, 2)  # think#1 once; fetch#1 once, fetch#2 on b-1


def test_estimated_usage_counts_and_is_labelled() -> None:
    log = _log()
    log.add(dispatched("think", 2))
    s = budget.spend(log.state(), 2000, pending=[ESTIMATED])
    assert (s.tokens, s.estimated_tokens) == (1160, 60)
    found = budget.check(log.state(), 2000, model_call=budget.Worst(prompt_tokens=3000, max_tokens=900,
                                                                       cost_usd=0.0), pending=[ESTIMATED])
    assert found is not None and found.budget == "max_tokens" and found.estimated
    assert "estimated" in found.message


def test_check_names_the_first_limit_exceeded_with_the_figures() -> None:
    state = _log().state()
    fits = budget.Worst(prompt_tokens=100, max_tokens=100, cost_usd=0.008)
    assert budget.check(state, 2000, model_call=fits) is None
    over = budget.Worst(prompt_tokens=100, max_tokens=100, cost_usd=0.0091)
    found = budget.check(state, 2000, model_call=over)
    assert found is not None
    assert (found.budget, found.limit, found.spent, found.needed) == ("max_cost_usd", 0.01, 0.001, 0.0091)
    assert found.message == "max_cost_usd 0.01: spent 0.001 + next model call at worst 0.0091 > 0.01"
    assert budget.check(state, 1000 + 60_000, model_call=fits) is not None  # max_wall_s: 60 s since creation
    assert budget.check(state, 2000, tool_calls=2) is None
    tools = budget.check(state, 2000, tool_calls=3)
    assert tools is not None and (tools.budget, tools.spent, tools.needed) == ("max_tool_calls", 0, 3)
    assert budget.check(_log(msgspec.UNSET).state(), 2000, model_call=over) is None  # no budget: no limit


def test_worst_case_uses_max_tokens_or_the_stated_default() -> None:
    price = Price(input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
    m = ModelSpec(adapter="openai", model="x", base_url="http://h", params={"max_tokens": 500})
    assert budget.worst_case(1000, m, price) == budget.Worst(prompt_tokens=1000, max_tokens=500, cost_usd=0.002)
    bare = ModelSpec(adapter="openai", model="x", base_url="http://h")
    w = budget.worst_case(1000, bare, price)
    assert w.max_tokens == budget.DEFAULT_MAX_OUTPUT_TOKENS == 4096 and w.tokens == 5096
    assert budget.worst_case(1000, bare, None).cost_usd == 0.0


def test_price_table_resolution_order() -> None:
    own = Price(input_usd_per_mtok=9.0)
    mine = Price(input_usd_per_mtok=7.0)
    named = ModelSpec(adapter="openai", model="gpt-4o-mini", base_url="http://h")
    assert price_for(named) == PRICES["gpt-4o-mini"]
    assert price_for(named, {"gpt-4o-mini": mine}) == mine
    assert price_for(msgspec.structs.replace(named, price=own), {"gpt-4o-mini": mine}) == own
    assert price_for(ModelSpec(adapter="openai", model="local-7b", base_url="http://h")) is None
    assert priced(named).price == PRICES["gpt-4o-mini"]


def test_a_halt_fails_its_step_and_ends_the_branch() -> None:
    log = _log()
    found = budget.check(log.state(), 2000, tool_calls=5)
    assert found is not None
    log.add(found.event("main", "fetch", 4000))
    state = log.state()
    assert step_statuses(state, "main") == [StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED]
    assert isinstance(state.branches["main"].halt, StepHalted)
    assert isinstance(next_action(state, "x-1"), EnterVerifying)
    with pytest.raises(InvalidTransition):
        log.add(StepHalted(branch_id="main", step_id="nope", reason="budget_exhausted", at_ms=1))
        log.state()


def test_workflow_budget_is_validated_and_left_out_when_unset() -> None:
    base = {"name": "w", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "x"}}]}
    spec = parse_workflow({**base, "budget": {"max_cost_usd": 1.5, "max_wall_s": 60}})
    assert spec.budget == Budget(max_cost_usd=1.5, max_wall_s=60.0)
    assert b"\"budget\"" not in msgspec.json.encode(parse_workflow(base))  # workflows without one hash as before
    with pytest.raises(WorkflowInvalid, match=r"max_tool_calls must be > 0 \(at `\$.budget.max_tool_calls`\)"):
        parse_workflow({**base, "budget": {"max_tool_calls": 0}})
    with pytest.raises(WorkflowInvalid, match="budget_tokens"):
        parse_workflow({**base, "budget": {"budget_tokens": 10}})
    assert Budget(max_cost_usd=1.0).over(Budget(max_cost_usd=5.0, max_wall_s=10.0)) == Budget(max_cost_usd=1.0,
                                                                                             max_wall_s=10.0)


def _printed(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_reel_run_and_show_print_the_end_reason_and_the_spend() -> None:
    state, _ = fold_log(GOLDEN_DIR / "hand_budget_halt.jsonl")
    halt = state.branches["main"].halt
    assert isinstance(halt, StepHalted)
    line = _printed(event_line(104, halt))  # what `reel run` prints as the commit lands
    assert "halted before solve:t2: budget_exhausted: max_cost_usd 0.001: spent 9.6e-05" in line
    shown = _printed(timeline(state))  # `reel show` (and the end of `reel run`)
    assert "budget: $0.0001 of $0.001, 2 of 10 tool calls" in shown
    assert "end reason budget_exhausted (before solve:t2): max_cost_usd 0.001" in shown
    assert "agent solve: failed, 1 turn, 1 tool call (0 error observations), budget_exhausted" in shown


def test_the_python_api_carries_budget_prices_and_code_policy() -> None:
    import reel

    agent = reel.Agent(name="a", instructions="i", model=reel.ScriptedModel(turns=[{"text": "x"}]),
                       budget=reel.Budget(max_cost_usd=1.0, max_tool_calls=3),
                       prices={"m": reel.Price(input_usd_per_mtok=1.0)}, on_code_change="fail")
    spec = agent.workflow("go")
    assert spec.budget == Budget(max_cost_usd=1.0, max_tool_calls=3)
    assert spec.price_table == {"m": Price(input_usd_per_mtok=1.0)} and spec.code_change_policy == "fail"
    bare = reel.Agent(name="a", instructions="i", model=reel.ScriptedModel(turns=[{"text": "x"}])).workflow("go")
    assert bare.budget is msgspec.UNSET and bare.code_change_policy == "continue"


def test_metrics_count_spend_by_source_and_halts_by_budget() -> None:
    from reel.shared.runtime import metrics

    def value(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    before = (value("reel_spend_usd_total", source="estimated"), value("reel_halts_total", reason="budget_exhausted",
                                                                        budget="max_cost_usd"))
    metrics.observe_commit("r-m", [dispatched("think", 1)])
    metrics.observe_commit("r-m", [AttemptSucceeded(branch_id="main", step_id="think", attempt=1, output_ref=OUT,
                                                    usage=ESTIMATED, at_ms=3000),
                                   StepHalted(branch_id="main", step_id="say", reason="budget_exhausted",
                                              budget="max_cost_usd", limit=0.01, spent=0.009, needed=0.002,
                                              at_ms=3000)])
    assert value("reel_spend_usd_total", source="estimated") == pytest.approx(before[0] + 0.0001)
    assert value("reel_halts_total", reason="budget_exhausted", budget="max_cost_usd") == before[1] + 1
    assert value("reel_budget_spent_ratio_count", budget="max_cost_usd") >= 1
