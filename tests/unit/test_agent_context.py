"""The context of every agent turn: candidates, the packer's groups and required
items, and the chat transcript the packed items become. ``pytest -k context_partition`` selects the partition
checks (docs/context.md)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from reel.shared.core.agent.turncontext import (
    INSTRUCTIONS,
    TurnItem,
    cut_result,
    result_max_tokens,
    tool_schemas,
    tools_tokens,
    turn_candidates,
    turn_items,
    turn_messages,
)
from reel.shared.core.chat.messages import ToolCall
from reel.shared.core.pack.packer import Candidate, PackPolicy, drop_reasons, pack
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.events import AttemptDispatched, ContextPartition
from reel.shared.core.run.ids import BranchId, ContextItemId
from reel.shared.core.run.planning import TextFacts
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec, parse_workflow
from tests.unit.agent_sim import Sim

MAIN = BranchId("main")


def workflow(policy: dict[str, Any], n_turns: int = 4) -> WorkflowSpec:
    turns: list[dict[str, Any]] = [
        {"text": f"turn {t}: let me look", "tool_calls": [
            {"name": "read_file", "arguments": {"path": f"f{t}.py"}},
            {"name": "run_tests", "arguments": {}}]} for t in range(1, n_turns)]
    turns.append({"text": "done"})
    return parse_workflow({"name": "w", "steps": [{
        "kind": "agent", "id": "solve", "instructions": "You fix bugs. Be brief.", "policy": policy,
        "context": [{"id": "task", "kind": "task", "text": "make the tests pass"},
                    {"id": "hint", "kind": "demo", "text": "a demo that the policy excludes"},
                    {"id": "notes", "kind": "notes", "text": "older notes", "stale": True}],
        "model": {"adapter": "scripted", "turns": turns},
        "tools": [{"name": "read_file", "python": "json:loads"}, {"name": "run_tests", "command": ["true"]}]}]})


def _tools(big: int = 0) -> dict[str, Any]:
    def run_tests(_: dict[str, Any]) -> str:
        raise RuntimeError("FAIL: 1 of 3")
    return {"read_file": lambda a: ("line\n" * big) + f"def f(): pass  # {a['path']}", "run_tests": run_tests}


def _turn_intents(sim: Sim) -> list[AttemptDispatched]:
    return [e for _, c in sim.log for e in c.events
            if isinstance(e, AttemptDispatched) and e.context is not None]


def check_partition(p: ContextPartition, candidates: set[str]) -> None:
    """Disjoint buckets whose union is the candidate set."""
    packed, available, dropped = set(p.packed), set(p.available), set(p.dropped)
    assert len(packed) == len(p.packed) and len(available) == len(p.available) and len(dropped) == len(p.dropped)
    assert not packed & available and not packed & dropped and not available & dropped
    assert packed | available | dropped == candidates


def expected_candidates(turn: int) -> set[str]:
    ids = {"instructions", "task", "hint", "notes"}
    for k in range(1, turn):
        ids |= {f"solve:t{k}:msg", f"solve:t{k}:c0:obs", f"solve:t{k}:c1:obs"}
    return ids


@pytest.mark.parametrize("budget", [10_000, 110, 0])
def test_agent_turn_context_partition_holds_for_every_turn(budget: int) -> None:
    room = workflow({"budget_tokens": 0}).steps[0]  # ``budget``: the items' room; the tools' schemas come first
    assert isinstance(room, AgentStep)
    reserved = tools_tokens(tool_schemas(room), TextFacts(DEFAULT_COUNTER))
    sim = Sim(workflow({"budget_tokens": budget + reserved, "exclude_kinds": ["demo"]}), _tools())
    state = sim.run()
    intents = _turn_intents(sim)
    assert [i.step_id for i in intents] == ["solve:t1", "solve:t2", "solve:t3", "solve:t4"]
    assert state.status == "verifying"
    for t, intent in enumerate(intents, start=1):
        p = intent.context
        assert p is not None
        check_partition(p, expected_candidates(t))
        assert {"hint", "notes"} <= set(p.dropped), "excluded kind and stale item: dropped whatever the budget"
        assert p.packed[:2] == ("instructions", "task"), "instructions and task lead, always packed"
        for k in range(1, t):  # a turn's message and its results are in one bucket together
            group = {f"solve:t{k}:msg", f"solve:t{k}:c0:obs", f"solve:t{k}:c1:obs"}
            assert sum(bool(group & set(b)) for b in (p.packed, p.available, p.dropped)) == 1, (t, k, p)
    last = intents[-1].context
    assert last is not None
    if budget == 10_000:
        assert not last.available and len(last.packed) == 2 + 3 * 3
    elif budget == 110:  # room for two of the three earlier turns: the oldest waits, whole
        assert last.available == ("solve:t1:msg", "solve:t1:c0:obs", "solve:t1:c1:obs")
        assert last.packed[2:] == tuple(f"solve:t{k}:{x}" for k in (2, 3) for x in ("msg", "c0:obs", "c1:obs"))
    else:  # each turn alone is larger than the whole budget: dropped; the required items still go
        assert last.packed == ("instructions", "task") and not last.available


def test_agent_turn_context_partition_cuts_a_result_over_the_item_cap_and_keeps_its_turn() -> None:
    sim = Sim(workflow({"budget_tokens": 10_000, "max_item_tokens": 60}, n_turns=3), _tools(big=80))
    sim.run()
    p = _turn_intents(sim)[-1].context
    assert p is not None
    check_partition(p, expected_candidates(3))
    for k in (1, 2):  # each read_file result is over the cap: cut to it, and its turn is packed whole
        assert {f"solve:t{k}:msg", f"solve:t{k}:c0:obs", f"solve:t{k}:c1:obs"} <= set(p.packed)
    assert p.trimmed == ("solve:t1:c0:obs", "solve:t2:c0:obs")
    assert isinstance(p.item_tokens, tuple)
    tokens = dict(zip(p.packed, p.item_tokens, strict=False))
    assert all(tokens[i] <= 60 for i in p.trimmed)
    results = [m["content"] for m in sim.requests[-1]["messages"] if m["role"] == "tool"]
    cut = [r for r in results if "[reel: output trimmed" in r]
    assert len(cut) == 2 and all(r.startswith("line\n") for r in cut), "the head is kept"
    assert cut[0].endswith("# f1.py") and cut[1].endswith("# f2.py"), "and the tail"


def test_a_tool_result_is_cut_to_its_token_bound_head_and_tail_kept() -> None:
    facts = TextFacts(DEFAULT_COUNTER)
    text = "".join(f"{i:05d} é€ " for i in range(3000))  # multi-byte characters at any cut
    assert cut_result(text, facts(text)[0], facts) is None, "a result that fits is left whole"
    cut = cut_result(text, 200, facts)
    assert cut is not None and facts(cut)[0] <= 200
    head, _, rest = cut.partition("\n[reel: output trimmed — ")
    assert text.startswith(head) and len(head) > 100
    note, _, tail = rest.partition("]\n")
    assert text.endswith(tail) and len(tail) > 100 and "bytes left out here" in note
    assert cut_result(text, 200, facts) == cut, "deterministic"
    assert cut_result(text, 1, facts) is not None, "a bound below the note's own tokens still ends"


@pytest.mark.parametrize(("budget", "item_cap", "bound"), [(8000, None, 4000), (8000, 60, 60), (9, None, 4),
                                                           (1, None, 1)])
def test_a_tool_result_is_packed_with_half_the_budget_at_most(budget: int, item_cap: int | None,
                                                               bound: int) -> None:
    assert result_max_tokens(PackPolicy(budget_tokens=budget, max_item_tokens=item_cap)) == bound


def test_the_packed_items_are_a_valid_chat_transcript() -> None:
    sim = Sim(workflow({"budget_tokens": 150}), _tools())
    sim.run()
    for body, intent in zip(sim.requests, _turn_intents(sim), strict=True):
        messages = body["messages"]
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert messages[0]["content"] == "You fix bugs. Be brief."
        assert "make the tests pass" in messages[1]["content"]
        open_calls: list[str] = []
        for m in messages[2:]:
            if m["role"] == "assistant":
                assert not open_calls, "every call is answered before the next assistant message"
                open_calls = [c["id"] for c in m.get("tool_calls", [])]
            else:
                assert m["role"] == "tool" and m["tool_call_id"] == open_calls.pop(0)
        assert not open_calls
        assert intent.context is not None
        assert sum(1 for m in messages if m["role"] == "assistant") == sum(
            1 for i in intent.context.packed if i.endswith(":msg"))


def test_turn_items_use_the_logs_call_ids_and_outcomes_not_yet_folded() -> None:
    spec = workflow({"budget_tokens": 1000}, n_turns=2)
    sim = Sim(spec, _tools())
    sim.run()
    assert sim.state is not None
    items = turn_items(sim.state, MAIN, spec.agent("solve"), 2, outputs={}, blobs=sim.blobs)
    assert [i.id for i in items] == ["instructions", "task", "hint", "notes", "solve:t1:msg", "solve:t1:c0:obs",
                                     "solve:t1:c1:obs"]
    msg, ok, err = items[4:]
    assert (msg.kind, msg.group, msg.text) == ("assistant", "solve:t1", "turn 1: let me look")
    assert [c.id for c in msg.tool_calls] == [ok.tool_call_id, err.tool_call_id] == ["call_t1_0", "call_t1_1"]
    assert (ok.is_error, err.is_error, err.text) == (False, True, "error (tool_error): FAIL: 1 of 3")
    assert [i.required for i in items[:4]] == [True, True, False, False]


# ---- the packer's groups and required items --------------------------------------------------------------


def c(id: str, tokens: int, **kw: Any) -> Candidate:
    return Candidate(id=ContextItemId(id), tokens=tokens, **kw)


def test_a_group_is_packed_or_left_out_as_a_unit_newest_first() -> None:
    cands = [c("sys", 5, required=True), c("task", 5, required=True),
             c("t1:msg", 3, group="t1"), c("t1:obs", 4, group="t1"),
             c("t2:msg", 3, group="t2"), c("t2:obs", 4, group="t2"), c("t3:msg", 6, group="t3")]
    p = pack(cands, PackPolicy(budget_tokens=24)).partition
    assert p.packed == ("sys", "task", "t2:msg", "t2:obs", "t3:msg") and p.available == ("t1:msg", "t1:obs")
    p = pack(cands, PackPolicy(budget_tokens=13)).partition  # the t3 group (6) does not fit in 3: t2 (7) neither
    assert p.packed == ("sys", "task") and p.available == ("t3:msg", "t2:msg", "t2:obs", "t1:msg", "t1:obs")
    assert pack(cands, PackPolicy(budget_tokens=0)).partition.packed == ("sys", "task"), "required beats budget"
    assert pack(cands, PackPolicy(budget_tokens=0)).packed_tokens == 10


def test_a_group_is_dropped_whole_and_never_deduplicated() -> None:
    cands = [c("task", 1, required=True, kind="task", content_hash="h"),
             c("t1:msg", 2, group="t1", content_hash="h"), c("t1:obs", 50, group="t1", kind="tool"),
             c("t2:msg", 2, group="t2", content_hash="same"), c("t2:obs", 2, group="t2", content_hash="same"),
             c("t3:msg", 30, group="t3"), c("t3:obs", 30, group="t3")]
    policy = PackPolicy(budget_tokens=40, max_item_tokens=40)
    p = pack(cands, policy).partition
    assert p.dropped == ("t1:msg", "t1:obs", "t3:msg", "t3:obs") and p.packed == ("task", "t2:msg", "t2:obs")
    assert drop_reasons(cands, policy) == {"t1:msg": "group_dropped", "t1:obs": "over_item_cap",
                                           "t3:msg": "over_budget", "t3:obs": "over_budget"}
    assert pack(cands, msgspec.structs.replace(policy, exclude_kinds=("task", "tool"))).partition.packed[0] == "task"


def test_transcript_of_hand_made_items() -> None:
    items = [TurnItem(id=INSTRUCTIONS, kind="system", text="sys", required=True),
             TurnItem(id=ContextItemId("task"), kind="task", text="do", required=True),
             TurnItem(id=ContextItemId("a:t1:msg"), kind="assistant", text="", group="a:t1",
                      tool_calls=(ToolCall(id="k", name="f", arguments="{}"),)),
             TurnItem(id=ContextItemId("a:t1:c0:obs"), kind="tool", text="42", group="a:t1", tool_call_id="k")]
    msgs = turn_messages(items, ["instructions", "task", "a:t1:msg", "a:t1:c0:obs"])
    assert [(m.role, m.content, m.tool_call_id) for m in msgs] == [
        ("system", "sys", None), ("user", "<context id='task' kind='task'>\ndo\n</context>", None),
        ("assistant", None, None), ("tool", "42", "k")]
    assert [c.tokens for c in turn_candidates(items, TextFacts(DEFAULT_COUNTER))][2] > 0  # calls are counted
