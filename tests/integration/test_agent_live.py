"""Live agent steps end to end: a real nats-server, the real executor, the real ``openai`` client over real
HTTP to the loopback chat-completions server (tests/support/chat_server.py). No mocks.

Tools: tests/integration/agent_tools.py (python) and agent_cmd.py (command).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from reel.services.executor.app import serve as executor_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.shared.core.run.events import AttemptSucceeded, StepsDeclared
from reel.shared.core.run.statecodec import STATE_ENCODER
from reel.shared.nats.blobstore import JetStreamBlobStore, is_inline
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.agent_support import (
    LOOKUP,
    agent_workflow,
    all_blobs,
    checks_tool,
    commits_of,
    start_and_rest,
    stream_bytes,
    turn_partition_ok,
)
from tests.integration.scenarios import attempt_of, wait_state
from tests.logcapture import info_logs
from tests.refold import assert_refold_identical
from tests.support.chat_server import ChatServer, call, empty, rate_limited, reply

_enc = STATE_ENCODER



# ---- the two-turn agent ----------------------------------------------------------------------------------
async def test_two_turn_live_agent_runs_to_verifying_context_partition(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, infra: Infra,
    cfg: Config, chat_server: ChatServer, api_key: str, log_dir: Path,
) -> None:
    spec = agent_workflow(chat_server, [LOOKUP, checks_tool(log_dir)])
    chat_server.script(
        reply(None, [call("lookup", {"key": "answer", "meet_in": str(log_dir)}, id="call_lookup_1"),
                     call("run_checks", {"suite": "unit", "meet_in": str(log_dir)})]),  # they meet: parallel
        reply("The answer is 42 and the checks pass."),
    )
    with info_logs() as logs:
        state = await start_and_rest(client, spec)
    assert state.status == "verifying", state.status
    branch = state.branches["main"]
    assert branch.agents is not msgspec.UNSET
    rec = branch.agents["solve"]
    assert rec.finished is not None and (rec.finished.status, rec.finished.turns) == ("succeeded", 2)
    assert rec.finished.output_ref is not None
    assert json.loads(await blobs.get(rec.finished.output_ref))["content"] == "The answer is 42 and the checks pass."

    # the server saw the tool schemas, and in turn 2 tool messages answering the calls' ids
    assert len(chat_server.requests) == 2 and chat_server.unscripted == 0
    t1, t2 = (r.body for r in chat_server.requests)
    for body in (t1, t2):
        assert [t["function"]["name"] for t in body["tools"]] == ["lookup", "run_checks"]
        assert body["tools"][0]["function"]["parameters"] == LOOKUP["parameters"]
        assert body["model"] == "loopback-1" and body["temperature"] == 0
    assert [m["role"] for m in t1["messages"]] == ["system", "user"]
    assert [m["role"] for m in t2["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    sent_ids = [c["id"] for c in t2["messages"][2]["tool_calls"]]
    assert sent_ids == ["call_lookup_1", "call_t1_1"]  # the provider's id unchanged; an empty one assigned
    assert [m["tool_call_id"] for m in t2["messages"][3:]] == sent_ids
    looked_up = json.loads(t2["messages"][3]["content"])
    assert looked_up == {"key": "answer", "value": "42", "idempotency_key": f"{state.run_id}/main/solve:t1:c0",
                         "attempt": 1}
    checked = json.loads(t2["messages"][4]["content"])
    assert checked["args"] == {"suite": "unit", "meet_in": str(log_dir)} and checked["attempt"] == 1
    assert checked["idempotency_key"] == f"{state.run_id}/main/solve:t1:c1"
    assert checked["leaked_key"] == "", "a command tool must never see the model's API key"
    assert "private scratch notes" not in json.dumps(t1) + json.dumps(t2)  # dropped by policy
    assert "background background" in json.dumps(t1) and "background background" not in json.dumps(t2)

    # prompt blob = the exact request body sent; output blob = the exact response message
    for i, sid in enumerate(("solve:t1", "solve:t2")):
        a = attempt_of(state, sid, 1)
        assert a.prompt_ref is not None and a.output_ref is not None
        assert json.loads(await blobs.get(a.prompt_ref)) == chat_server.requests[i].body
        assert a.usage.input_tokens == 12 and a.usage.output_tokens == 7 and a.usage.cost_usd > 0
    answer = json.loads(await blobs.get(attempt_of(state, "solve:t1", 1).output_ref))  # type: ignore[arg-type]
    assert [c["id"] for c in answer["tool_calls"]] == ["call_lookup_1", ""]  # as the provider sent it

    # every turn has a partition, known in advance
    base = {"instructions", "task", "notes", "background"}
    turn_partition_ok(state, "solve:t1", base)
    p1 = attempt_of(state, "solve:t1", 1).context
    assert p1 is not None and (p1.packed, p1.available, p1.dropped) == (("instructions", "task", "background"), (),
                                                                         ("notes",))
    group = {"solve:t1:msg", "solve:t1:c0:obs", "solve:t1:c1:obs"}
    turn_partition_ok(state, "solve:t2", base | group)
    p2 = attempt_of(state, "solve:t2", 1).context
    assert p2 is not None and p2.packed == ("instructions", "task", "solve:t1:msg", "solve:t1:c0:obs",
                                            "solve:t1:c1:obs")
    assert (p2.available, p2.dropped) == (("background",), ("notes",))

    # the commits: a turn's answer declares its calls and carries both intents (they run in parallel);
    # the last result carries turn 2's intent
    commits = await commits_of(event_log, state.run_id)
    kinds = [[type(e).__name__ for e in c.events] for c in commits]
    answered = next(k for k in kinds if "StepsDeclared" in k and "AttemptSucceeded" in k)
    assert answered == ["AttemptSucceeded", "StepsDeclared", "AttemptDispatched", "AttemptDispatched"]
    last_result = next(c for c in commits if any(isinstance(e, StepsDeclared) and e.steps[0].step_id == "solve:t2"
                                                 for e in c.events))
    assert isinstance(last_result.events[0], AttemptSucceeded) and last_result.events[0].step_id.startswith(
        "solve:t1:c")
    assert len(commits) in (7, 8), kinds  # 8 when the two results land in two commits, 7 when in one
    await assert_refold_identical(event_log, state)

    # the API key: sent to the server, and nowhere in the stream, the blobs, the markers or the logs
    assert chat_server.requests[0].headers["Authorization"] == f"Bearer {api_key}"
    assert api_key.encode() not in await stream_bytes(infra, cfg)
    assert not [b for b in await all_blobs(infra) if api_key.encode() in b]
    markers = [await infra.outcomes.get(k) for k in await infra.outcomes.keys()]
    assert markers and not [m for m in markers if api_key.encode() in (m.value or b"")]
    assert logs and api_key not in repr(logs)
    # messages: one per commit; a small blob is a chunk and a meta record; one marker per success
    counts = {name: (await infra.js.stream_info(stream)).state.messages for name, stream in (
        ("events", cfg.names.events_stream), ("blob", f"OBJ_{cfg.names.blob_bucket}"),
        ("marker", f"KV_{cfg.names.outcome_bucket}"))}
    # bodies: the workflow, 2 prompts, 2 answers, 2 results; those of at most REEL_INLINE_MAX_BYTES ride in
    # their refs and are not stored
    refs = [state.workflow_ref, *(r for sid in ("solve:t1", "solve:t2", "solve:t1:c0", "solve:t1:c1")
                                  for r in (attempt_of(state, sid, 1).prompt_ref, attempt_of(state, sid, 1).output_ref)
                                  if r is not None)]
    assert len(refs) == 7
    inline = [r for r in refs if is_inline(r)]
    assert {r.size_bytes <= 2048 for r in refs} == {True, False}  # some of each: the test sees both kinds
    assert [r.size_bytes <= 2048 for r in refs] == [is_inline(r) for r in refs]
    assert counts == {"events": len(commits), "blob": 2 * (len(refs) - len(inline)), "marker": 4}, counts
    took_ms = commits[-1].events[0].at_ms - commits[0].events[0].created_ms  # type: ignore[union-attr]
    print(f"\ncommits per run: {len(commits)}: {kinds}\nmessages: {counts}\nstart to verifying: {took_ms} ms")


# ---- the model's mistakes are observations ---------------------------------------------------------------
async def test_unknown_tool_bad_arguments_and_tool_errors_become_observations(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer, api_key: str,
    log_dir: Path,
) -> None:
    explode = {"name": "explode", "python": "tests.integration.agent_tools:explode",
               "parameters": {"type": "object", "properties": {"reason": {"type": "string"}}}}
    spec = agent_workflow(chat_server, [LOOKUP, explode, checks_tool(log_dir, exit_code=3, name="failing")])
    chat_server.script(
        reply(None, [call("no_such_tool", {}), call("lookup", "{not json"), call("lookup", {"key": 7}),
                     call("explode", {"reason": "boom"}), call("failing", {})]),
        empty(),  # turn 2, attempt 1: an empty response is a failed attempt
        reply("Understood: nothing worked."),
    )
    state = await start_and_rest(client, spec)
    assert state.status == "verifying"
    kinds = [attempt_of(state, f"solve:t1:c{i}", 1).error_kind for i in range(5)]
    assert kinds == ["unknown_tool", "invalid_arguments", "invalid_arguments", "tool_error", "exit_3"]
    t2 = [attempt_of(state, "solve:t2", n) for n in (1, 2)]
    assert (t2[0].status, t2[0].error_kind, t2[1].status) == ("failed", "empty_response", "succeeded")
    tool_messages = [m for m in chat_server.requests[-1].body["messages"] if m["role"] == "tool"]
    texts = [m["content"] for m in tool_messages]
    assert texts[0].startswith("error (unknown_tool): no tool named 'no_such_tool'")
    assert texts[1].startswith("error (invalid_arguments):") and "not valid JSON" in texts[1]
    assert texts[2].startswith("error (invalid_arguments):") and "(at `$.key`)" in texts[2]
    assert texts[3] == "error (tool_error): explode raised ValueError: exploded: boom"
    assert texts[4].startswith("error (exit_3): failing exited 3:") and "checks failed: 1 of 3" in texts[4]
    assert len(chat_server.requests[-1].body["messages"]) == 2 + 1 + 5
    rec = state.branches["main"].agents["solve"]  # type: ignore[index]
    assert rec.finished is not None and rec.finished.status == "succeeded"
    await assert_refold_identical(event_log, state)


async def test_rate_limited_turn_waits_retry_after_then_succeeds_in_two_attempts(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer, api_key: str,
    log_dir: Path,
) -> None:
    chat_server.script(rate_limited(0.4), reply("Done without tools."))
    state = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP]))
    first, second = state.branches["main"].attempts["solve:t1"]
    assert (first.status, first.error_kind, first.retryable) == ("failed", "rate_limited", True)
    assert second.status == "succeeded" and len(chat_server.requests) == 2
    assert first.finished_ms is not None and second.dispatched_ms - first.finished_ms >= 400  # Retry-After honoured
    assert chat_server.requests[0].body == chat_server.requests[1].body
    await assert_refold_identical(event_log, state)


# ---- rewind to turn 1 --------------------------------------------------------------------------------------
async def test_rewind_to_turn_one_forks_a_branch_that_calls_the_model_again(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer,
    api_key: str, log_dir: Path,
) -> None:
    chat_server.script(reply(None, [call("lookup", {"key": "answer"}, id="first")]), reply("It is 42."),
                       reply("Second try: 42."))
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg):
        done = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP]))
        main_before = _enc.encode(done.branches["main"])
        rewound = await client.rewind(done.run_id, at_step="solve:t1", idempotency_key="again")
        assert rewound.ok and rewound.created and rewound.branch_id, rewound
        new = rewound.branch_id
        state = await wait_state(event_log, done.run_id,
                                 lambda s: s.status == "verifying" and s.verifying_branch == new,
                                 what="the rewound branch to reach verifying")
    assert len(chat_server.requests) == 3  # the model is called again for turn 1 of the new branch
    assert chat_server.requests[2].body == chat_server.requests[0].body
    assert _enc.encode(state.branches["main"]) == main_before  # the old branch stays intact
    fork = state.branches[new]
    assert fork.from_step == "solve:t1" and fork.agents is not msgspec.UNSET
    rec = fork.agents["solve"]
    assert len(rec.turns) == 1 and rec.finished is not None and rec.finished.turns == 1
    assert attempt_of(state, "solve:t1", 1, new).dispatched_lsn > rewound.lsn
    await assert_refold_identical(event_log, state)


# ---- bad input -------------------------------------------------------------------------------------------
async def test_a_python_tool_that_does_not_import_is_refused_at_start(
    executor: None, client: ReelClient, chat_server: ChatServer,
) -> None:
    broken = {**LOOKUP, "python": "tests.integration.no_such_module:lookup"}
    reply_ = await client.start(agent_workflow(chat_server, [LOOKUP, broken | {"name": "broken"}]))
    assert not reply_.ok and reply_.run_id is None and reply_.error is not None
    assert "python tool 'tests.integration.no_such_module:lookup' does not resolve" in reply_.error.message
    assert "(at `$.steps[0].tools[1].python`)" in reply_.error.message
    assert chat_server.requests == []
