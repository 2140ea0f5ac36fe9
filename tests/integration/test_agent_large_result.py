"""A tool result too large for the turn's budget, end to end: a real nats-server, the real executor, the real
``openai`` client over real HTTP to the loopback chat-completions server (tests/support/chat_server.py).

The next turn's request still holds the turn that called the tool: its result cut to its head and tail with a
note between them (at most half the budget), listed in the partition's ``trimmed`` and by ``reel show`` — not the
whole turn left out, which would leave the model not knowing it had called the tool.
"""

from __future__ import annotations

import pytest

from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config
from tests.integration.agent_support import KEY_ENV, start_and_rest
from tests.integration.scenarios import attempt_of
from tests.integration.test_cli import reel
from tests.refold import assert_refold_identical
from tests.support.chat_server import ChatServer, call, reply

LOG = "\n".join(f"line {i}: the service answered in {i % 97} ms" for i in range(1500))  # ~55 KB, ~15k tokens
BUDGET = 2000


def workflow(server: ChatServer) -> WorkflowSpec:
    return parse_workflow({"name": "large-result", "steps": [{
        "kind": "agent", "id": "solve", "max_turns": 3, "policy": {"budget_tokens": BUDGET},
        "instructions": "Read the log, then answer.",
        "context": [{"id": "task", "kind": "task", "text": "How slow was the slowest answer?"}],
        "model": {"adapter": "openai", "base_url": server.url, "model": "loopback-1", "api_key_env": KEY_ENV,
                  "timeout_s": 10},
        "tools": [{"name": "read_log", "description": "The service's log.", "recorded": {"output": LOG},
                   "parameters": {"type": "object", "properties": {}}}]}]})


@pytest.mark.usefixtures("executor", "api_key")
async def test_a_result_larger_than_the_budget_reaches_the_next_turn_cut(
        client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer, cfg: Config) -> None:
    chat_server.script(reply(None, [call("read_log", {})]), reply("96 ms"))
    state = await start_and_rest(client, workflow(chat_server))
    assert len(chat_server.requests) == 2
    messages = chat_server.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"], "turn 1 is in the transcript"
    result = messages[3]["content"]
    assert result.startswith("line 0: ") and result.endswith("line 1499: the service answered in 44 ms")
    assert "[reel: output trimmed — " in result and len(result) < len(LOG) // 4
    p = attempt_of(state, "solve:t2", 1).context
    assert p is not None and p.trimmed == ("solve:t1:c0:obs",)
    assert {"solve:t1:msg", "solve:t1:c0:obs"} <= set(p.packed)
    assert isinstance(p.packed_tokens, int) and p.packed_tokens <= BUDGET
    assert attempt_of(state, "solve:t1:c0", 1).status == "succeeded"  # the whole result is stored as it was
    await assert_refold_identical(event_log, state)
    code, out, err = await reel(cfg, "show", state.run_id)
    assert code == 0 and "solve:t2#1 trimmed (head and tail only): solve:t1:c0:obs" in out, (out, err)
