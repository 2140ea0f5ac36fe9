"""A model endpoint of the user's own, plugged in by import path, through the real executor."""

from __future__ import annotations

import pytest

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient


async def test_a_user_adapter_is_loaded_by_import_path(executor: None, client: ReelClient) -> None:
    spec = parse_workflow({"name": "custom", "steps": [{
        "kind": "model", "id": "ask", "max_attempts": 2, "instructions": "say hi",
        "model": {"adapter": "tests.integration.echo_adapter:make"},
        "context": [{"id": "q", "text": "the question"}]}]})
    reply = await client.start(spec)
    assert reply.run_id
    state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    first, second = state.branches["main"].attempts["ask"]
    assert (first.status, first.error_kind, first.usage.cost_usd) == ("failed", "rate_limited", 0.001)
    assert second.status == "succeeded" and second.usage.cost_usd == 0.002
    assert second.output_ref is not None
    assert (await client.blobs.get(second.output_ref)).decode().startswith("echo: ")  # type: ignore[union-attr]


async def test_an_unimportable_adapter_fails_the_attempt_not_the_executor(executor: None,
                                                                          client: ReelClient) -> None:
    spec = parse_workflow({"name": "missing", "steps": [{
        "kind": "model", "id": "ask", "max_attempts": 3, "model": {"adapter": "no_such_module:make"}}]})
    reply = await client.start(spec)
    assert reply.run_id
    state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    (only,) = state.branches["main"].attempts["ask"]  # non-retryable: one attempt, then the step failed
    assert (only.status, only.error_kind) == ("failed", "adapter_unavailable")


def test_an_adapter_that_is_neither_builtin_nor_an_import_path_is_refused() -> None:
    with pytest.raises(WorkflowInvalid) as err:
        parse_workflow({"name": "x", "steps": [{"kind": "model", "id": "a", "model": {"adapter": "gpt-5"}}]})
    assert "module:factory" in err.value.message and "`$.steps[0].model.adapter`" in err.value.message


@pytest.mark.parametrize("kind", ["model", "agent"])
async def test_an_adapters_own_bug_fails_the_attempt_the_same_way_in_a_model_step_and_an_agent_turn(
        executor: None, client: ReelClient, kind: str) -> None:
    step: dict[str, object] = {"kind": kind, "id": "ask", "max_attempts": 2,
                               "model": {"adapter": "tests.integration.echo_adapter:buggy"},
                               "context": [{"id": "task", "kind": "task", "text": "say hi"}]}
    reply = await client.start(parse_workflow({"name": f"buggy-{kind}", "steps": [step]}))
    assert reply.run_id
    state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    attempts = state.branches["main"].attempts["ask" if kind == "model" else "ask:t1"]
    (only,) = attempts  # not retryable: one attempt
    assert (only.status, only.error_kind) == ("failed", "adapter_error")
    assert only.error_message is not None and "KeyError" in only.error_message
