"""What a model attempt records, against a real nats-server, the real executor and the real ``openai`` client
over real HTTP to a loopback chat-completions server (tests/support/chat_server.py, aiohttp): the finish reason
exactly as the server sent it, a cut answer (``length``) never taken as a final one, usage that says where it
comes from, and errors that keep their cause (docs/models.md).
"""

from __future__ import annotations

import io
import json
import socket
from typing import Any

import msgspec
from rich.console import Console

from reel.services.timeline.render import timeline
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.state import RunState
from reel.shared.core.run.traces import run_spans
from reel.shared.core.run.views import build_episode_view, serialize_view
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.integration.agent_support import BACKGROUND, KEY_ENV, LOOKUP, agent_workflow, start_and_rest
from tests.integration.scenarios import attempt_of
from tests.refold import assert_refold_identical
from tests.support.chat_server import Behaviour, ChatServer, call, reply, streamed

CUT = "the model's answer was cut at max_tokens (finish_reason length)"


def model_workflow(server: ChatServer | str, **step: Any) -> WorkflowSpec:
    """One plain ``kind: model`` step on the openai adapter at ``server`` (a base URL when a string)."""
    url = server if isinstance(server, str) else server.url
    return parse_workflow({"name": "live-model", "steps": [{
        "kind": "model", "id": "write", "instructions": "Write one sentence.",
        "context": [{"id": "task", "kind": "task", "text": "Describe the sea."}],
        "model": {"adapter": "openai", "base_url": url, "model": "loopback-1", "api_key_env": KEY_ENV,
                  "timeout_s": 10, "params": {"max_tokens": 8}}, **step}]})


def no_finish_reason(text: str) -> Behaviour:
    """A 200 completion whose choice carries no ``finish_reason`` at all."""
    b = reply(text)
    choice = {k: v for k, v in b.body["choices"][0].items() if k != "finish_reason"}
    return Behaviour(body={**b.body, "choices": [choice]})


async def _final(client: ReelClient, spec: WorkflowSpec) -> RunState:
    started = await client.start(spec)
    assert started.ok and started.run_id, started
    return await client.wait_for(started.run_id, ("verifying", "completed", "cancelled"), timeout_s=60)


# ---- finish reasons --------------------------------------------------------------------------------------
async def test_a_turn_cut_at_max_tokens_fails_the_agent_truncated_not_succeeded(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
    chat_server: ChatServer, api_key: str,
) -> None:
    chat_server.script(reply("The answer is that the sea", finish_reason="length"))
    state = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP], max_attempts=1))
    rec = state.branches["main"].agents["solve"]  # type: ignore[index]
    assert rec.finished is not None and rec.finished.status == "failed", "a cut answer was taken as a final one"
    assert rec.finished.error_kind == "truncated" and CUT in rec.finished.message
    a = attempt_of(state, "solve:t1", 1)
    assert (a.status, a.error_kind, a.retryable, a.finish_reason) == ("failed", "truncated", False, "length")
    assert a.error_message == CUT
    assert isinstance(a.error_ref, msgspec.Struct)  # the cut answer is kept, whole: the exact response message
    assert json.loads(await blobs.get(a.error_ref))["content"] == "The answer is that the sea"
    assert a.usage.input_tokens == 12 and a.usage.source == "reported"
    view = build_episode_view(state)
    turn = next(s for s in view.steps if s.step_id == "solve:t1")
    assert turn.attempts[0].finish_reason == "length"  # a verifier sees it
    await assert_refold_identical(event_log, state)


async def test_on_truncated_retry_asks_again_and_continue_takes_the_cut_answer_marked(
    executor: None, client: ReelClient, chat_server: ChatServer, api_key: str,
) -> None:
    chat_server.script(reply("The sea is", finish_reason="length"), reply("The sea is wide."))
    state = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP], on_truncated="retry"))
    first, second = state.branches["main"].attempts["solve:t1"]
    assert (first.status, first.error_kind, first.retryable, first.finish_reason) == ("failed", "truncated", True,
                                                                                      "length")
    assert (second.status, second.finish_reason, second.truncated) == ("succeeded", "stop", msgspec.UNSET)
    assert state.branches["main"].agents["solve"].finished.status == "succeeded"  # type: ignore[index,union-attr]

    chat_server.script(reply("The sea is", finish_reason="length"))
    state = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP], on_truncated="continue"))
    only = attempt_of(state, "solve:t1", 1)
    assert (only.status, only.finish_reason, only.truncated) == ("succeeded", "length", True)
    rec = state.branches["main"].agents["solve"]  # type: ignore[index]
    assert rec.finished is not None and rec.finished.status == "succeeded"


async def test_finish_reasons_are_recorded_as_sent_on_turns_and_model_steps(
    executor: None, client: ReelClient, chat_server: ChatServer, api_key: str,
) -> None:
    chat_server.script(reply(None, [call("lookup", {"key": "k"})]), reply("Done.", finish_reason="end_turn"))
    state = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP]))
    assert attempt_of(state, "solve:t1", 1).finish_reason == "tool_calls"
    assert attempt_of(state, "solve:t2", 1).finish_reason == "end_turn"  # an unknown string, kept as-is
    assert attempt_of(state, "solve:t1:c0", 1).finish_reason is msgspec.UNSET  # a tool call has none

    chat_server.script(no_finish_reason("The sea is wide."))
    state = await _final(client, model_workflow(chat_server))
    a = attempt_of(state, "write", 1)
    assert (a.status, a.finish_reason) == ("succeeded", None)  # the server sent none: None, not "stop"


async def test_a_model_step_cut_at_max_tokens_fails_truncated(
    executor: None, client: ReelClient, blobs: JetStreamBlobStore, chat_server: ChatServer, api_key: str,
) -> None:
    chat_server.script(reply("The sea is a", finish_reason="length"))
    state = await _final(client, model_workflow(chat_server))
    a = attempt_of(state, "write", 1)
    assert a.status == "failed", "a cut answer was recorded as a success"
    assert (a.error_kind, a.finish_reason, a.error_message) == ("truncated", "length", CUT)
    assert isinstance(a.error_ref, msgspec.Struct) and await blobs.get(a.error_ref) == b"The sea is a"
    assert next(s for s in build_episode_view(state).steps if s.step_id == "write").status == "failed"


def shown(state: RunState) -> str:
    """``reel show``'s timeline of ``state``, rendered wide (rich, no colours)."""
    console = Console(width=250, record=True, color_system=None, file=io.StringIO())
    console.print(timeline(state))
    return console.export_text()


async def test_reel_show_json_and_trace_name_the_finish_reason_and_usage_source(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer, api_key: str,
) -> None:
    chat_server.script(reply(None, [call("lookup", {"key": "k"})]), reply("Done.", usage=None))
    state = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP]))
    t1, t2 = attempt_of(state, "solve:t1", 1), attempt_of(state, "solve:t2", 1)
    assert (t1.usage.source, t1.usage.input_tokens) == ("reported", 12)
    assert t2.usage.source == "estimated" and t2.usage.input_tokens > 0  # the server sent no usage: Reel counted
    text = shown(state)
    row1 = next(line for line in text.splitlines() if "solve:t1 " in line or line.startswith("│ solve:t1 "))
    assert "12/7 reported" in row1 and "tool_calls" in row1, row1
    row2 = next(line for line in text.splitlines() if "t2" in line and "estimated" in line)
    assert "stop" in row2, row2
    est = t2.usage
    assert f"12 in (reported) + {est.input_tokens} in (estimated)" in text, text
    doc = json.loads(serialize_view(build_episode_view(state)))
    turn1 = next(s for s in doc["steps"] if s["step_id"] == "solve:t1")["attempts"][0]
    assert turn1["finish_reason"] == "tool_calls" and turn1["usage"]["source"] == "reported"
    assert doc["usage_by_source"]["estimated"]["input_tokens"] == est.input_tokens
    assert doc["usage_by_source"]["reported"]["input_tokens"] == 12
    spans = run_spans(await event_log.read(state.run_id))
    chats = [s for s in spans if s.kind == "CLIENT"]
    assert [s.attributes["gen_ai.response.finish_reasons"] for s in chats] == [("tool_calls",), ("stop",)]
    assert [s.attributes["reel.usage.source"] for s in chats] == ["reported", "estimated"]


# ---- usage sources ---------------------------------------------------------------------------------------
def closed_port_url() -> str:
    """A loopback base URL nothing listens on (a port bound, then closed): every connection is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


async def test_an_unreachable_server_adds_no_tokens_to_the_run(
    executor: None, client: ReelClient, api_key: str,
) -> None:
    state = await _final(client, model_workflow(closed_port_url(), max_attempts=2))
    attempts = state.branches["main"].attempts["write"]
    assert [(a.status, a.error_kind) for a in attempts] == [("failed", "connection"), ("failed", "connection")]
    assert [(a.usage.input_tokens, a.usage.output_tokens) for a in attempts] == [
        (0, 0), (0, 0)], "a refused connection processed no token"
    assert [a.usage.source for a in attempts] == ["none", "none"]
    view = build_episode_view(state)
    assert (view.usage.input_tokens, view.usage.output_tokens) == (0, 0)
    assert "0 in (none), 0 out (none)" in shown(state)

    agent = agent_workflow(ChatServer(), [LOOKUP], max_attempts=2)  # never started: its port is 0
    spec = msgspec.structs.replace(agent, steps=(msgspec.structs.replace(
        agent.steps[0], model=msgspec.structs.replace(agent.steps[0].model, base_url=closed_port_url())),))
    state = await start_and_rest(client, spec)
    turns = state.branches["main"].attempts["solve:t1"]
    assert [(a.error_kind, a.usage.input_tokens, a.usage.source) for a in turns] == [
        ("connection", 0, "none"), ("connection", 0, "none")]


# ---- errors keep their cause -----------------------------------------------------------------------------
VALIDATION = "messages.2.content: Input should be a valid string"


def big_error(status: int = 500, headers: dict[str, str] | None = None) -> tuple[Behaviour, bytes]:
    """A 2 KB error body, in llama-cpp-python's shape, whose message ends with its cause."""
    trace = "Traceback (most recent call last):\n" + "".join(
        f'  File "/srv/llama_cpp/server/app.py", line {100 + i}, in handler\n' for i in range(30))
    body = json.dumps({"error": {"message": trace + VALIDATION, "type": "internal_server_error", "param": None,
                                 "code": None}}).encode()
    assert len(body) >= 2048, len(body)
    return Behaviour(status=status, body=body, headers=headers or {}), body


async def test_a_server_error_keeps_its_own_message_and_its_whole_body(
    executor: None, client: ReelClient, blobs: JetStreamBlobStore, chat_server: ChatServer, api_key: str,
) -> None:
    failing, body = big_error()
    chat_server.script(failing, reply("The sea is wide."))
    state = await _final(client, model_workflow(chat_server, max_attempts=2))
    first, second = state.branches["main"].attempts["write"]
    assert (first.status, first.error_kind, second.status) == ("failed", "server_error", "succeeded")
    assert first.error_message is not None and first.error_message.endswith(VALIDATION), first.error_message
    assert "\n" not in first.error_message  # one line
    assert isinstance(first.error_ref, msgspec.Struct) and first.error_ref.media_type == "application/json"
    assert await blobs.get(first.error_ref) == body  # the whole body, exactly as the server sent it
    assert first.usage.source == "none" and first.usage.input_tokens == 0

    failing, body = big_error()
    chat_server.script(failing, failing)
    state = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP], max_attempts=2))
    turn = attempt_of(state, "solve:t1", 2)
    assert turn.error_message is not None and turn.error_message.endswith(VALIDATION)
    assert isinstance(turn.error_ref, msgspec.Struct) and await blobs.get(turn.error_ref) == body
    rec = state.branches["main"].agents["solve"]  # type: ignore[index]
    assert rec.finished is not None and VALIDATION in rec.finished.message


async def test_a_retry_waits_for_retry_after(
    executor: None, client: ReelClient, chat_server: ChatServer, api_key: str,
) -> None:
    failing, _ = big_error(503, {"Retry-After": "1"})
    chat_server.script(failing, reply("The sea is wide."))
    state = await _final(client, model_workflow(chat_server, max_attempts=2))
    first, second = state.branches["main"].attempts["write"]
    assert (first.error_kind, second.status) == ("server_error", "succeeded")
    assert first.finished_ms is not None and second.finished_ms is not None
    assert second.finished_ms - first.finished_ms >= 1000, "the retry went before the server's Retry-After: 1"
    assert second.usage.latency_ms < 1000  # the wait is not the call's latency
    assert second.dispatched_ms is not None and second.dispatched_ms - first.finished_ms >= 1000, \
        "the retry's intent was committed before the wait (an agent turn's waits first: one rule for both)"


# ---- the context budget counts what is sent ----------------------------------------------------------------
async def test_the_budget_counts_the_tool_schemas_and_the_instructions_as_sent(
    executor: None, client: ReelClient, blobs: JetStreamBlobStore, chat_server: ChatServer, api_key: str,
) -> None:
    tight = DEFAULT_COUNTER.count(BACKGROUND) + 60  # room for the instructions, the task and the background only
    chat_server.script(reply("Done."))
    state = await start_and_rest(client, agent_workflow(chat_server, [LOOKUP], policy={
        "budget_tokens": tight, "exclude_kinds": ["scratch"]}))
    a = attempt_of(state, "solve:t1", 1)
    p = a.context
    assert p is not None and a.prompt_ref is not None
    sent = msgspec.json.decode(await blobs.get(a.prompt_ref))
    tools_tokens = DEFAULT_COUNTER.count(msgspec.json.encode(sent["tools"]).decode())
    assert (p.reserved_tokens, p.tokenizer) == (tools_tokens, "heuristic-v1")
    assert tools_tokens > 60 and "background" not in p.packed, "the tool schemas were not counted against the budget"
    assert isinstance(p.packed_tokens, int) and p.packed_tokens + tools_tokens <= tight

    chat_server.script(reply("The sea is wide."))
    state = await _final(client, model_workflow(chat_server))
    w = attempt_of(state, "write", 1)
    m = w.context
    assert m is not None and (m.reserved_tokens, m.tokenizer) == (0, "heuristic-v1")  # a model step offers no tools
    assert m.packed[:2] == ("instructions", "task"), "its instructions and task: required, as an agent's first turn's"
    assert w.prompt_ref is not None
    sent = msgspec.json.decode(await blobs.get(w.prompt_ref))
    assert sent["messages"] == [{"role": "system", "content": "Write one sentence."}, {
        "role": "user", "content": "<context id='task' kind='task'>\nDescribe the sea.\n</context>"}]
    assert "tools" not in sent
    assert chat_server.requests[-1].body["messages"] == sent["messages"], "the blob is what was sent"


async def test_a_streamed_answer_without_usage_is_labelled_estimated(
    executor: None, client: ReelClient, chat_server: ChatServer, api_key: str,
) -> None:
    full = streamed("The sea is wide and deep.", chunks=8)
    chat_server.script(Behaviour(chunks=full.chunks[:-1]))  # no usage chunk: the server counted nothing for us
    spec = model_workflow(chat_server)
    step = spec.steps[0]
    spec = msgspec.structs.replace(spec, steps=(msgspec.structs.replace(
        step, model=msgspec.structs.replace(step.model, stream=True)),))
    state = await _final(client, spec)
    a = attempt_of(state, "write", 1)
    assert (a.status, a.finish_reason, a.usage.source) == ("succeeded", "stop", "estimated")
    assert a.usage.input_tokens > 0 and a.usage.output_tokens > 0
    assert chat_server.requests[0].body["stream"] is True


async def test_a_stored_error_body_never_holds_the_api_key(
    executor: None, client: ReelClient, blobs: JetStreamBlobStore, chat_server: ChatServer, api_key: str,
) -> None:
    echo = '{"error": {"message": "rejected header: {authorization}", "type": "invalid_request_error"}}'
    chat_server.script(Behaviour(status=400, body=echo))
    state = await _final(client, model_workflow(chat_server))
    a = attempt_of(state, "write", 1)
    assert a.error_kind == "bad_request" and isinstance(a.error_ref, msgspec.Struct)
    stored = await blobs.get(a.error_ref)
    assert api_key.encode() not in stored and b"rejected header: Bearer ***" in stored, stored
    assert a.error_message is not None and api_key not in a.error_message
