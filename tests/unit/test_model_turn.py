"""A ``kind: model`` step's attempt is the first turn of an agent without tools: the same candidates, partition and
request (:func:`reel.shared.core.agent.turncontext.model_turn`), plus what only a model step has
(``include_previous_outputs``, outputs trimmed before packing)."""

from __future__ import annotations

from typing import Any

import msgspec

from reel.shared.core.agent.turncontext import model_turn
from reel.shared.core.chat.messages import wire_request
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.events import AttemptDispatched
from reel.shared.core.run.planning import TextFacts
from reel.shared.core.workflow.spec import ModelStep, parse_workflow
from tests.unit.agent_sim import Sim

CONTEXT: list[dict[str, Any]] = [
    {"id": "task", "kind": "task", "text": "make the tests pass"},
    {"id": "notes", "kind": "notes", "text": "older notes " * 10, "priority": 1},
    {"id": "more", "kind": "notes", "text": "newer notes " * 10, "priority": 2},
    {"id": "demo", "kind": "demo", "text": "a demo the policy excludes"},
    {"id": "old", "kind": "notes", "text": "stale notes", "stale": True},
]
POLICY = {"budget_tokens": 40, "exclude_kinds": ["demo"], "drop_stale": True}


def _step(kind: str, **extra: Any) -> dict[str, Any]:
    model = {"adapter": "scripted", **({"turns": [{"text": "done"}]} if kind == "agent" else {"outputs": ["done"]})}
    return {"kind": kind, "id": "fix", "instructions": "You fix bugs.", "context": CONTEXT, "policy": POLICY,
            "model": model, **extra}


def test_a_model_step_asks_what_a_tool_less_agent_asks_in_its_first_turn() -> None:
    sim = Sim(parse_workflow({"name": "w", "steps": [_step("agent")]}), {})
    sim.run()
    turn = next(e for _, c in sim.log for e in c.events if isinstance(e, AttemptDispatched) and e.step_id == "fix:t1")
    assert turn.prompt_ref is not None and turn.context is not None
    agent_sent = msgspec.json.decode(sim.blobs[turn.prompt_ref.sha256])

    spec = parse_workflow({"name": "w", "steps": [_step("model")]})
    step = spec.steps[0]
    assert isinstance(step, ModelStep)
    made = model_turn(step, spec, run_id="r-sim", attempt=1, outputs={}, facts=TextFacts(DEFAULT_COUNTER))
    sent = msgspec.to_builtins(wire_request(made.request))
    assert sent["messages"] == agent_sent["messages"] and "tools" not in sent
    assert made.packed.partition == turn.context
    p = made.packed.partition
    assert p.packed == ("instructions", "task", "more"), "the required ones first"
    assert set(p.dropped) == {"demo", "old"} and p.available == ("notes",), p
    assert made.request.prompt_tokens == p.packed_tokens and p.reserved_tokens == 0


def test_a_model_step_adds_earlier_outputs_after_its_context_and_marks_the_trimmed_ones() -> None:
    spec = parse_workflow({"name": "w", "steps": [
        {"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "A"}},
        {"kind": "tool", "id": "b", "tool": {"type": "recorded", "output": "B"}},
        {"kind": "model", "id": "m", "include_previous_outputs": True,
         "model": {"adapter": "scripted", "outputs": ["x"]},
         "context": [{"id": "task", "kind": "task", "text": "t"}, {"id": "from-a", "from_step": "a"}]},
        {"kind": "tool", "id": "c", "tool": {"type": "recorded", "output": "C"}}]})
    step = spec.steps[2]
    assert isinstance(step, ModelStep)
    made = model_turn(step, spec, run_id="r", attempt=2, outputs={"a": "A…", "b": "B"},
                      facts=TextFacts(DEFAULT_COUNTER), trimmed=("a",))
    assert [i.id for i in made.items] == ["task", "from-a", "out-a", "out-b"]
    assert [i.text for i in made.items] == ["t", "A…", "A…", "B"]
    assert made.packed.partition.trimmed == ("from-a", "out-a")
    assert made.request.attempt == 2 and made.request.step_id == "m"
    assert [m.role for m in made.request.messages] == ["user"], "no instructions: no system message"
