"""The context partition (docs/context.md) end to end: ``pytest -k context_partition``.

Harness: a workflow whose packer is configured to drop known items, so the
expected partition is known in advance. Runs on a real nats-server through the
real executor service.
"""

from __future__ import annotations

from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.refold import assert_refold_identical

WORDS = ["alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike"]


def _item_text(i: int) -> str:
    return f"{WORDS[i]} " * 20  # distinct texts of equal size


ITEM_TOKENS = DEFAULT_COUNTER.count(_item_text(0))
CANDIDATES = [f"doc-{i}" for i in range(10)]
assert len({DEFAULT_COUNTER.count(_item_text(i)) for i in range(10)}) == 1, "harness needs equal-size items"


def _workflow() -> dict[str, object]:
    context = []
    for i in range(10):
        item: dict[str, object] = {"id": f"doc-{i}", "text": _item_text(i), "priority": float(i)}
        if i == 0:
            item["stale"] = True  # dropped by policy (stale)
        if i == 1:
            item["kind"] = "scratch"  # dropped by policy (excluded kind)
        context.append(item)
    return {
        "name": "partition-harness",
        "steps": [
            {"kind": "model", "id": "plan", "model": {"adapter": "scripted", "outputs": ["plan"]},
             "policy": {"budget_tokens": 6 * ITEM_TOKENS, "exclude_kinds": ["scratch"]}, "context": context},
            {"kind": "tool", "id": "act", "tool": {"type": "scripted", "outputs": ["acted"]}},
            {"kind": "model", "id": "review", "max_attempts": 3, "include_previous_outputs": True,
             "model": {"adapter": "scripted",
                       "outputs": [{"error": "context_missing", "message": "needed doc-9"}, "reviewed"]},
             "policy": {"budget_tokens": 6 * ITEM_TOKENS}, "context": context},
        ],
    }


async def test_it_context_partition(executor: None, client: ReelClient, event_log: JetStreamEventLog) -> None:
    reply = await client.start(parse_workflow(_workflow()))
    assert reply.ok and reply.run_id
    state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    view = build_episode_view(state)

    # steps 1–4: one model step, 10 candidates, a budget admitting 6
    plan = view.step("plan").attempts[0].context
    assert plan is not None
    assert len(plan.packed) == 6
    packed, available, dropped = set(plan.packed), set(plan.available), set(plan.dropped)
    assert len(available) + len(dropped) == 4
    assert not (packed & available) and not (packed & dropped) and not (available & dropped)
    assert packed | available | dropped == set(CANDIDATES)
    assert dropped, "a capture that only records packed is the half-implementation"
    # known in advance: policy drops doc-0 (stale) and doc-1 (excluded kind); the budget keeps the
    # six highest-priority eligible items (doc-4..doc-9) and leaves doc-3, doc-2 available
    assert plan.dropped == ("doc-0", "doc-1")
    assert plan.packed == ("doc-4", "doc-5", "doc-6", "doc-7", "doc-8", "doc-9")
    assert plan.available == ("doc-3", "doc-2")

    # step 5: every model-step attempt of the completed multi-step run carries a partition
    model_attempts = [a for s in view.steps if s.kind == "model" for a in s.attempts]
    assert len(model_attempts) == 3  # plan#1, review#1 (failed), review#2
    assert view.failed_attempts == 1
    for attempt in model_attempts:
        assert attempt.context is not None, f"{attempt.step_id}#{attempt.attempt} has no partition"
        c = attempt.context
        assert len(set(c.packed) | set(c.available) | set(c.dropped)) == len(c.packed + c.available + c.dropped)
    review = view.step("review").attempts[-1].context
    assert review is not None and {"out-plan", "out-act"} <= set(review.packed + review.available + review.dropped)
    tool_attempts = [a for s in view.steps if s.kind == "tool" for a in s.attempts]
    assert all(a.context is None for a in tool_attempts)

    # step 6: the partition survives a cold re-fold
    cold = await assert_refold_identical(event_log, state)
    assert build_episode_view(cold).step("plan").attempts[0].context == plan
