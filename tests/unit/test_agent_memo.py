"""Incremental agent-turn contexts (shared/core/agent/memo.py) against full rebuilds, on every turn:
long sim runs under and over budget, failing and parallel calls, a rewind onto a new branch, and the golden
agent logs (with stand-in bodies for their blobs); plus the packer's fast path against its full path."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from reel.shared.core.pack.packer import Candidate, PackPolicy, _classify, group_facts, pack, pack_groups
from reel.shared.core.run.events import BranchForked, Commit
from reel.shared.core.run.ids import LSN, BranchId, ContextItemId, StepId
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from tests.support.turncheck import check_turns
from tests.unit.agent_sim import Sim

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def long_agent(turns: int, *, budget: int, calls: int = 2, policy: dict[str, Any] | None = None) -> WorkflowSpec:
    script: list[dict[str, Any]] = [
        {"text": f"turn {t}: " + "thinking " * (t % 5), "tool_calls": [
            {"name": "read_file", "arguments": {"path": f"f{t}_{c}.py"}} if c % 2 == 0 else
            {"name": "run_tests", "arguments": {"n": t}} for c in range(calls)]} for t in range(1, turns)]
    script.append({"text": "done"})
    return parse_workflow({"name": "long", "steps": [{
        "kind": "agent", "id": "solve", "instructions": "You fix bugs.", "max_turns": turns + 1,
        "max_parallel_tools": 2, "policy": {"budget_tokens": budget, **(policy or {})},
        "context": [{"id": "task", "kind": "task", "text": "make the tests pass"},
                    {"id": "hint", "kind": "demo", "text": "a demo", "priority": 1.0},
                    {"id": "old", "kind": "notes", "text": "older notes", "stale": True},
                    {"id": "dup", "kind": "notes", "text": "a demo"}],
        "model": {"adapter": "scripted", "turns": script},
        "tools": [{"name": "read_file", "python": "json:loads"}, {"name": "run_tests", "command": ["true"]}]}]})


def tools() -> dict[str, Any]:
    runs = [0]

    def run_tests(args: dict[str, Any]) -> str:
        runs[0] += 1  # a rewound turn's call answers differently from the first time
        if args["n"] % 3 == 0:
            raise RuntimeError(f"FAIL: {args['n']} of 3 (run {runs[0]})")
        return "ok " * args["n"] + f"(run {runs[0]})"
    return {"read_file": lambda a: f"def f(): pass  # {a['path']}\n" * (len(a["path"]) % 4 + 1),
            "run_tests": run_tests}


@pytest.mark.parametrize("budget", [100_000, 400, 180])  # the budget counts the two tools' schemas (~60) first
def test_every_turn_of_a_long_run_is_the_full_rebuild(budget: int) -> None:
    spec = long_agent(30, budget=budget)
    sim = Sim(spec, tools())
    state = sim.run(max_actions=1000)
    assert state.status == "verifying", state.status
    got = check_turns(sim.log, spec, sim.blobs, recorded=True)
    assert got.turns == 30
    assert got.dropped == 30  # the policy drops ``hint``'s duplicate, ``old`` (stale) on every turn
    if budget == 100_000:
        assert got.over_budget == 0
    else:
        assert got.over_budget > 10  # earlier turns left out for want of room
    assert got.rebuilt <= 2 * got.turns  # each turn built once with its outcomes pending, once folded
    assert got.kept > got.turns * 10


def test_the_fast_path_case_and_a_policy_free_run() -> None:
    spec = long_agent(12, budget=100_000, calls=1, policy={"drop_stale": False, "dedupe": False})
    sim = Sim(spec, tools())
    sim.run(max_actions=500)
    got = check_turns(sim.log, spec, sim.blobs, recorded=True)
    assert (got.turns, got.over_budget, got.dropped) == (12, 0, 0)


def test_a_rewind_onto_a_new_branch_is_the_full_rebuild_with_one_memo_across_it() -> None:
    spec = long_agent(10, budget=300)
    sim = Sim(spec, tools())
    sim.run(max_actions=500)
    head = sim.log[-1][0]
    sim.commit([BranchForked(branch_id=BranchId("b2"), parent_branch_id=BranchId("main"), fork_lsn=LSN(head),
                             from_step=StepId("solve:t4"), at_ms=sim.tick())])
    state = sim.run(max_actions=500)
    assert state.active_branch == "b2" and state.status == "verifying"
    got = check_turns(sim.log, spec, sim.blobs, recorded=True)
    assert got.branches == {"main", "b2"} and got.turns == 10 + 7
    assert got.over_budget > 0


class StandIns(dict[str, bytes]):
    """A body for any sha256: the golden logs' blobs are not stored (an answer's JSON message, else text)."""

    def __missing__(self, sha: str) -> bytes:
        return json.dumps({"role": "assistant", "content": f"answer {sha[:8]}"}).encode()


def golden(name: str) -> list[tuple[int, Commit]]:
    lines = (GOLDEN / f"{name}.jsonl").read_text().splitlines()
    return [(d["lsn"], msgspec.convert(d["commit"], Commit)) for d in map(json.loads, lines)]


@pytest.mark.parametrize(("name", "agent", "turns"), [("hand_agent_rewind", "solve", 4),
                                                       ("hand_agent_approval", "ship", 2)])
@pytest.mark.parametrize("budget", [8000, 30])
def test_the_golden_agent_logs_turns_are_the_full_rebuild(name: str, agent: str, turns: int, budget: int) -> None:
    prep = {"kind": "tool", "id": "prep", "tool": {"type": "recorded", "output": ""}}
    spec = parse_workflow({"name": "g", "steps": [prep, {
        "kind": "agent", "id": agent, "instructions": "Do it.", "policy": {"budget_tokens": budget},
        "context": [{"id": "task", "kind": "task", "text": "the task"}],
        "model": {"adapter": "scripted", "turns": [{"text": "x"}]}}]})
    got = check_turns(golden(name), spec, StandIns(), recorded=False)
    assert got.turns == turns  # rewind: t1 twice, t2, t2 on the fork; approval: t1, t2
    assert (got.over_budget + got.dropped > 0) == (budget == 30)  # at 30 tokens a turn's group is too big


def _random_candidates(rng: random.Random) -> list[Candidate]:
    out = []
    for i in range(rng.randint(0, 30)):
        group = f"g{rng.randint(0, 5)}" if rng.random() < 0.5 else None
        out.append(Candidate(id=ContextItemId(f"c{i}"), kind=rng.choice(["message", "tool", "demo"]),
                             tokens=rng.randint(0, 40), priority=rng.choice([0.0, 0.0, 1.0, -1.0]),
                             stale=rng.random() < 0.1, content_hash=rng.choice(["", "a", "b", f"h{i}"]),
                             group=group, required=group is None and rng.random() < 0.15))
    return out


def test_the_packers_fast_path_gives_what_the_full_path_gives() -> None:
    rng = random.Random(11)
    fast = 0
    for _ in range(3000):
        cands = _random_candidates(rng)
        policy = PackPolicy(budget_tokens=rng.choice([0, 50, 200, 2000]), exclude_kinds=rng.choice([(), ("demo",)]),
                            max_item_tokens=rng.choice([None, 30]), drop_stale=rng.random() < 0.5,
                            dedupe=rng.random() < 0.5)
        got = pack(cands, policy)
        reasons, required, units = _classify(cands, policy)
        full = _full_pack(cands, policy, reasons, required, units)
        assert got == full, (cands, policy)
        fast += not reasons and len(got.partition.packed) == len(cands)
    assert fast > 300  # the fast path was taken often


def test_packing_by_groups_gives_what_packing_the_candidates_gives() -> None:
    rng = random.Random(9)
    for n in range(3000):
        head = [Candidate(id=ContextItemId(f"h{i}"), kind=rng.choice(["system", "task", "demo", "notes"]),
                          tokens=rng.randint(0, 30), priority=rng.choice([0.0, 1.0, -1.0]), stale=rng.random() < 0.1,
                          content_hash=rng.choice(["", "a", f"x{i}"]), required=rng.random() < 0.3)
                for i in range(rng.randint(0, 4))]
        groups = [[Candidate(id=ContextItemId(f"t{g}:{i}"), kind=rng.choice(["assistant", "tool", "demo"]),
                             tokens=rng.randint(0, 25), priority=rng.choice([0.0, 0.0, 0.5]),
                             stale=rng.random() < 0.03, content_hash=rng.choice(["", "a"]), group=f"t{g}")
                   for i in range(rng.randint(1, 3))] for g in range(rng.randint(0, 12))]
        policy = PackPolicy(budget_tokens=rng.choice([0, 40, 120, 400]), exclude_kinds=rng.choice([(), ("demo",)]),
                            max_item_tokens=rng.choice([None, 20]), drop_stale=rng.random() < 0.5,
                            dedupe=rng.random() < 0.5)
        flat = [*head, *(c for g in groups for c in g)]
        assert pack_groups(head, [group_facts(g, policy) for g in groups], policy) == pack(flat, policy), n
    with pytest.raises(ValueError, match="not grouped"):
        pack_groups([Candidate(id=ContextItemId("x"), tokens=1, group="g")], [], PackPolicy(budget_tokens=9))
    with pytest.raises(ValueError, match="unique"):
        pack_groups([Candidate(id=ContextItemId("x"), tokens=1)], [group_facts(
            [Candidate(id=ContextItemId("x"), tokens=1, group="g")], PackPolicy(budget_tokens=9))],
            PackPolicy(budget_tokens=9))


def _full_pack(cands: list[Candidate], policy: PackPolicy, reasons: dict[ContextItemId, str], required: list[int],
               units: list[Any]) -> Any:
    """The packer's greedy path, as it was before the fast path (the reference)."""
    from reel.shared.core.pack.packer import Packed
    from reel.shared.core.run.events import ContextPartition
    ranked = sorted(units, key=lambda u: (-u.priority, -u.positions[0]))
    left = policy.budget_tokens - sum(cands[p].tokens for p in required)
    packed_pos = list(required)
    available: list[ContextItemId] = []
    for unit in ranked:
        if unit.tokens <= left:
            left -= unit.tokens
            packed_pos.extend(unit.positions)
        else:
            available.extend(cands[p].id for p in unit.positions)
    packed_pos.sort()
    ids = [c.id for c in cands]
    dropped = tuple(i for i in ids if i in reasons)
    tokens = sum(cands[p].tokens for p in packed_pos)
    by_id = {c.id: c.tokens for c in cands}
    return Packed(partition=ContextPartition(
        packed=tuple(cands[p].id for p in packed_pos), available=tuple(available), dropped=dropped,
        drop_reasons=tuple(reasons[i] for i in dropped) if dropped else msgspec.UNSET, packed_tokens=tokens,
        item_tokens=tuple(by_id[i] for i in (*(cands[p].id for p in packed_pos), *available, *dropped))),
        packed_tokens=tokens)


