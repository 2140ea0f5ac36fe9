"""Run budgets end to end: a real nats-server, the real executor, the real ``openai`` client over real HTTP to the
loopback chat-completions server (tests/support/chat_server.py). The budget is checked before each model call with
its worst case; a call that would exceed it is never made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from reel.shared.core.run import budget
from reel.shared.core.run.events import CodeIdentity, StepHalted
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config
from tests.integration.agent_support import KEY_ENV, LOOKUP, start_and_rest
from tests.integration.scenarios import attempt_of
from tests.integration.test_cli import reel
from tests.refold import assert_refold_identical
from tests.support.chat_server import ChatServer, call, reply

PRICE = {"input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.60}
MAX_TOKENS = 1000
TURN1_USAGE = (10_000, 100)  # what the server reports for turn 1: USD 0.00156 at PRICE


def workflow(server: ChatServer, **budget_: Any) -> WorkflowSpec:
    return parse_workflow({"name": "budgeted-agent", "budget": budget_, "steps": [{
        "kind": "agent", "id": "solve", "max_turns": 4,
        "instructions": "Use the tools, then answer.",
        "context": [{"id": "task", "kind": "task", "text": "Find the answer."}],
        "model": {"adapter": "openai", "base_url": server.url, "model": "loopback-1", "api_key_env": KEY_ENV,
                  "timeout_s": 10, "params": {"max_tokens": MAX_TOKENS}, "price": PRICE},
        "tools": [LOOKUP]}]})


def _script(server: ChatServer) -> None:
    server.script(reply(None, [call("lookup", {"key": "answer"})], usage=TURN1_USAGE), reply("42"))


@pytest.mark.usefixtures("executor", "api_key")
async def test_a_call_whose_worst_case_exceeds_max_cost_usd_is_never_made(
    client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer,
) -> None:
    # turn 1's worst case (≈ USD 0.0006: its prompt + 1000 output tokens) fits USD 0.002; after it the run has spent
    # USD 0.00156, so turn 2's worst case (≈ 0.0006 more) would exceed it: turn 2 is never sent
    _script(chat_server)
    state = await start_and_rest(client, workflow(chat_server, max_cost_usd=0.002))
    assert len(chat_server.requests) == 1, "the second turn's request was sent despite the budget"

    branch = state.branches["main"]
    halt = branch.halt
    assert isinstance(halt, StepHalted)
    assert (halt.reason, halt.budget, halt.limit, halt.step_id) == ("budget_exhausted", "max_cost_usd", 0.002,
                                                                    "solve:t2")
    spent = attempt_of(state, "solve:t1", 1).usage.cost_usd
    assert spent == pytest.approx(0.00156) and halt.spent == pytest.approx(spent)
    assert isinstance(halt.needed, float) and spent < 0.002 < spent + halt.needed
    assert "max_cost_usd 0.002" in halt.message and "spent 0.00156" in halt.message
    assert "solve:t2" not in branch.attempts, "turn 2 must have no attempt: no intent for a call never made"
    assert attempt_of(state, "solve:t1:c0", 1).status == "succeeded"  # the call of turn 1 ran and is recorded
    assert branch.agents is not msgspec.UNSET
    finished = branch.agents["solve"].finished
    assert finished is not None and (finished.status, finished.error_kind, finished.turns) == (
        "failed", "budget_exhausted", 1)
    assert state.status in ("verifying", "completed")
    summary = budget.summary(state, state.created_ms)
    assert summary.startswith("$0.0016 of $0.002"), summary
    await assert_refold_identical(event_log, state)


@pytest.mark.usefixtures("executor", "api_key")
async def test_within_budget_both_turns_run(client: ReelClient, chat_server: ChatServer) -> None:
    # the same run with room for turn 2's worst case: both requests are made (the limit above is what stopped it)
    _script(chat_server)
    state = await start_and_rest(client, workflow(chat_server, max_cost_usd=0.01, max_tool_calls=1))
    assert len(chat_server.requests) == 2
    assert state.branches["main"].halt is msgspec.UNSET
    assert budget.summary(state, state.created_ms) == "$0.0016 of $0.01, 1 of 1 tool calls"


@pytest.mark.usefixtures("executor", "api_key")
async def test_max_tool_calls_stops_before_the_call(client: ReelClient, chat_server: ChatServer) -> None:
    chat_server.script(reply(None, [call("lookup", {"key": "answer"}), call("lookup", {"key": "other"})]),
                       reply("42"))
    state = await start_and_rest(client, workflow(chat_server, max_tool_calls=1))
    halt = state.branches["main"].halt
    assert isinstance(halt, StepHalted) and (halt.budget, halt.spent, halt.needed) == ("max_tool_calls", 0, 2)
    assert len(chat_server.requests) == 1
    assert not [s for s in state.branches["main"].attempts if s.startswith("solve:t1:c")], "no call may run"


@pytest.mark.usefixtures("executor")
async def test_plain_steps_halt_before_the_call_that_would_exceed(client: ReelClient) -> None:
    spec = parse_workflow({"name": "budgeted-plain", "budget": {"max_tool_calls": 1, "max_tokens": 4000}, "steps": [
        {"kind": "tool", "id": "fetch", "tool": {"type": "recorded", "output": "data"}},
        {"kind": "model", "id": "think", "instructions": "Think.",
         "model": {"adapter": "scripted", "outputs": ["ok"], "params": {"max_tokens": 3000}}},
        {"kind": "model", "id": "again", "instructions": "Again.", "model": {"adapter": "scripted", "outputs": ["ok"]}},
        {"kind": "tool", "id": "store", "tool": {"type": "recorded", "output": "done"}}]})
    state = await start_and_rest(client, spec)
    branch = state.branches["main"]
    # fetch ran (1 tool call), think's worst case (its prompt + 3000) fit 4000 tokens; again's (prompt + the 4096
    # default) did not: it has no attempt, and store never ran
    assert [a.status for a in branch.attempts["fetch"]] == ["succeeded"]
    assert [a.status for a in branch.attempts["think"]] == ["succeeded"]
    assert "again" not in branch.attempts and "store" not in branch.attempts
    halt = branch.halt
    assert isinstance(halt, StepHalted) and (halt.step_id, halt.budget) == ("again", "max_tokens")
    assert halt.needed is not msgspec.UNSET and halt.needed > 4096
    assert attempt_of(state, "think", 1).usage.source == "estimated"  # scripted: Reel's own count, labelled
    assert "estimated" in halt.message
    fetch, think = attempt_of(state, "fetch", 1).code, attempt_of(state, "think", 1).code
    assert isinstance(fetch, CodeIdentity) and (fetch.kind, fetch.name) == ("builtin", "fetch")
    assert isinstance(think, CodeIdentity) and (think.kind, think.name) == ("model", "scripted")


async def test_reel_run_prints_the_end_reason(cfg: Config, tmp_path: Path) -> None:
    wf = tmp_path / "capped.yaml"
    wf.write_text("name: capped\nbudget: {max_tool_calls: 1}\nsteps:\n"
                  "  - {kind: tool, id: a, tool: {type: recorded, output: one}}\n"
                  "  - {kind: tool, id: b, tool: {type: recorded, output: two}}\n")
    code, out, err = await reel(cfg, "run", str(wf))
    flat = " ".join(out.split())
    assert "halted before b: budget_exhausted: max_tool_calls 1: spent 1 + next tool call at worst 1 > 1" in flat, out
    assert "end reason budget_exhausted (before b)" in flat and "budget: 1 of 1 tool calls" in flat, out
    assert code == 3, (code, out, err)  # a failed run's exit code
