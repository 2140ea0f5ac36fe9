"""The ``openai`` adapter: the real ``openai`` client against a real loopback chat-completions server.

No HTTP mocks: ``chat_server`` (tests/support/chat_server.py) listens on 127.0.0.1 and
answers as scripted; every request body it received is asserted on.
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
import uuid
from typing import Any

import msgspec
import openai
import pytest

from reel.shared.core.chat.messages import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ToolSchema,
    chat_request,
    prompt_request,
    wire_request,
)
from reel.shared.core.errors import ModelError, ToolCallInvalid
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.models import make_chat_model
from reel.shared.models.openai import CLIENTS, PLACEHOLDER_KEY, retry_after_s
from tests.support.chat_server import (
    Behaviour,
    ChatServer,
    call,
    empty,
    error,
    rate_limited,
    reply,
    server_error,
    slow,
    streamed,
)

TOOLS = (
    ToolSchema(name="read_file", description="Read a file of the scratch copy.",
               parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    ToolSchema(name="run_tests", description="Run the unit tests.", parameters={"type": "object", "properties": {}}),
)


def _spec(server: ChatServer, **extra: Any) -> ModelSpec:
    fields = {"adapter": "openai", "base_url": server.url, "model": "loopback-model", "params": {"temperature": 0},
              "timeout_s": 10, "price": {"input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.60}, **extra}
    return msgspec.convert(fields, ModelSpec)


def _turn1(spec: ModelSpec, attempt: int = 1) -> ChatRequest:
    return chat_request(spec, run_id="r-1", step_id="solve:t1", attempt=attempt, turn=1, tools=TOOLS, messages=[
        ChatMessage(role="system", content="You fix bugs."), ChatMessage(role="user", content="calc.py is broken")])


async def _fails(server: ChatServer, behaviour: Behaviour, **extra: Any) -> ModelError:
    server.script(behaviour)
    before = len(server.requests)
    with pytest.raises(ModelError) as err:
        await make_chat_model(_spec(server, **extra)).complete_chat(_turn1(_spec(server, **extra)))
    assert len(server.requests) == before + 1, "the client's own retries are off: one request per attempt"
    return err.value


async def test_a_turn_sends_the_exact_body_and_the_next_echoes_the_call_ids(chat_server: ChatServer) -> None:
    spec = _spec(chat_server)
    model = make_chat_model(spec)
    sent_calls = [call("read_file", {"path": "calc.py"}, id="call_abc"), call("run_tests", {}, id="call_def")]
    chat_server.script(reply(None, sent_calls, usage=(1000, 200)), reply("The typo is fixed."))
    req = _turn1(spec)
    resp = await model.complete_chat(req)

    seen = chat_server.requests[0]
    assert seen.body == wire_request(req)  # exactly the prompt blob the executor stores before the call
    assert [t["function"]["name"] for t in seen.body["tools"]] == ["read_file", "run_tests"]
    assert seen.body["temperature"] == 0 and seen.headers["Authorization"] == f"Bearer {PLACEHOLDER_KEY}"
    assert resp.message == {"role": "assistant", "content": None, "tool_calls": sent_calls}  # as the server sent it
    assert [(c.id, c.name, c.parsed_arguments()) for c in resp.tool_calls] == [
        ("call_abc", "read_file", {"path": "calc.py"}), ("call_def", "run_tests", {})]
    assert (resp.finish_reason, resp.model, resp.input_tokens, resp.output_tokens) == (
        "tool_calls", "loopback-1", 1000, 200)
    assert resp.cost_usd == pytest.approx(0.00015 + 0.00012)

    results = [ChatMessage(role="tool", tool_call_id=c.id, content=f"result of {c.name}") for c in resp.tool_calls]
    turn2 = chat_request(spec, run_id="r-1", step_id="solve:t2", turn=2, tools=TOOLS,
                         messages=[*req.messages, resp.assistant_message(), *results])
    final = await model.complete_chat(turn2)
    assert (final.text, final.tool_calls, final.finish_reason) == ("The typo is fixed.", (), "stop")
    body2 = chat_server.requests[1].body
    assert body2 == wire_request(turn2)
    assert body2["messages"][2]["tool_calls"] == sent_calls
    assert [m["tool_call_id"] for m in body2["messages"][3:]] == ["call_abc", "call_def"]
    assert chat_server.unscripted == 0


async def test_empty_and_duplicate_call_ids_are_assigned_and_echoed(chat_server: ChatServer) -> None:
    spec = _spec(chat_server)
    chat_server.script(reply(None, [call("run_tests", {}, id=""), call("read_file", {"path": "a"}, id="dup"),
                                    call("read_file", {"path": "b"}, id="dup")]))
    resp = await make_chat_model(spec).complete_chat(_turn1(spec))
    assert [c.id for c in resp.tool_calls] == ["call_t1_0", "dup", "call_t1_2"]
    assert [c["id"] for c in resp.message["tool_calls"]] == ["", "dup", "dup"]  # the provider's message, unchanged
    assert resp.assistant_message().tool_calls == resp.tool_calls


async def test_malformed_arguments_and_unknown_tools_come_back_as_sent(chat_server: ChatServer) -> None:
    spec = _spec(chat_server)
    chat_server.script(reply(None, [call("read_file", '{"path": "calc.py"', id="c1"),
                                    call("delete_everything", {"really": True}, id="c2")]))
    resp = await make_chat_model(spec).complete_chat(_turn1(spec))
    broken, unknown = resp.tool_calls
    assert broken.arguments == '{"path": "calc.py"'  # raw text kept: the loop reports it to the model
    with pytest.raises(ToolCallInvalid) as bad:
        broken.parsed_arguments()
    assert "c1" in bad.value.message and "read_file" in bad.value.message
    assert unknown.name == "delete_everything" and unknown.name not in {t.name for t in TOOLS}


@pytest.mark.parametrize(("behaviour", "kind", "retryable", "words"), [
    (server_error(500), "server_error", True, "500"),
    (server_error(503), "server_error", True, "503"),
    (error(400, "Invalid value for 'temperature'"), "bad_request", False, "Invalid value for 'temperature'"),
    (error(401, "Incorrect API key provided", code="invalid_api_key"), "auth", False, "Incorrect API key"),
    (error(403, "Project does not have access"), "auth", False, "does not have access"),
    (error(404, "The model `loopback-model` does not exist", code="model_not_found"), "not_found", False,
     "does not exist"),
    (error(400, "Too long", code="context_length_exceeded"), "context_length", False, "Too long"),
    (error(400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"),
     "context_length", False, "4096"),
    (error(429, "You exceeded your current quota", code="insufficient_quota"), "quota_exceeded", False, "quota"),
    (empty(), "empty_response", True, "neither content nor tool calls"),
    (empty(no_choices=True), "empty_response", True, "no choices"),
    (Behaviour(body=b"<html>proxy error</html>"), "malformed_response", True, "proxy error"),
])
async def test_http_errors_map_to_kinds(chat_server: ChatServer, behaviour: Behaviour, kind: str, retryable: bool,
                                        words: str) -> None:
    err = await _fails(chat_server, behaviour)
    assert (err.kind, err.retryable, err.retry_after_s) == (kind, retryable, None)
    assert words in err.message  # the provider's message is recorded


async def test_429_sets_the_next_attempts_delay_from_retry_after(chat_server: ChatServer) -> None:
    err = await _fails(chat_server, rate_limited(2))
    assert (err.kind, err.retryable, err.retry_after_s) == ("rate_limited", True, 2.0)
    assert "Rate limit reached" in err.message
    ms = await _fails(chat_server, error(429, "slow down", headers={"retry-after-ms": "1500", "Retry-After": "9"}))
    assert ms.retry_after_s == 1.5


def test_retry_after_in_every_form() -> None:
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now_s=1445412470.0) == 10.0
    assert retry_after_s({"retry-after": "0.25"}) == 0.25
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None


async def test_a_slow_endpoint_times_out_as_a_retryable_attempt(chat_server: ChatServer) -> None:
    err = await _fails(chat_server, slow(), timeout_s=0.3)
    assert (err.kind, err.retryable) == ("timeout", True) and "0.3 s" in err.message


async def test_an_unreachable_endpoint_is_a_retryable_connection_error() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = msgspec.convert({"adapter": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "model": "m"}, ModelSpec)
    with pytest.raises(ModelError) as err:
        await make_chat_model(spec).complete_chat(_turn1(spec))
    assert (err.value.kind, err.value.retryable) == ("connection", True) and str(port) in err.value.message


def _everything_said(err: BaseException) -> str:
    parts = [str(err), repr(err), repr(err.args), "".join(traceback.format_exception(err))]
    cause: BaseException | None = err
    while cause is not None:
        parts.append(repr(cause))
        cause = cause.__cause__ or cause.__context__
    return "\n".join(parts)


async def test_the_api_key_never_appears_in_errors_or_logs(chat_server: ChatServer, caplog: pytest.LogCaptureFixture,
                                                           capfd: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    key = f"sk-reel-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("REEL_TEST_API_KEY", key)
    for name in ("", "openai", "httpx", "httpx2", "httpcore", "httpcore2"):
        caplog.set_level(logging.DEBUG, logger=name or None)
    spec = _spec(chat_server, api_key_env="REEL_TEST_API_KEY", timeout_s=0.3)
    model = make_chat_model(spec)
    assert key not in repr(model)
    # The server echoes the Authorization header back in its messages, as careless proxies do.
    chat_server.script(error(401, "Incorrect API key provided: {authorization}", code="invalid_api_key"),
                       server_error(), error(400, "bad key {authorization}"), slow(),
                       Behaviour(body=b"{authorization} is not JSON".replace(b"{authorization}", key.encode())),
                       reply("ok"))
    said = []
    for attempt in range(1, 6):
        with pytest.raises(ModelError) as err:
            await model.complete_chat(_turn1(spec, attempt))
        said.append(_everything_said(err.value))
    assert "Incorrect API key provided: Bearer ***" in said[0]
    ok = await model.complete_chat(_turn1(spec, 6))
    assert all(s.headers["Authorization"] == f"Bearer {key}" for s in chat_server.requests)  # it was sent
    capped = capfd.readouterr()
    logged = "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    assert caplog.records, "the client's debug logging was captured"
    for text in [*said, logged, capped.out, capped.err, repr(ok), msgspec.json.encode(ok).decode()]:
        assert key not in text


async def test_an_unset_key_variable_is_a_non_retryable_auth_error(chat_server: ChatServer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REEL_UNSET_KEY", raising=False)
    spec = _spec(chat_server, api_key_env="REEL_UNSET_KEY")
    with pytest.raises(ModelError) as err:
        await make_chat_model(spec).complete_chat(_turn1(spec))
    assert (err.value.kind, err.value.retryable) == ("auth", False) and "REEL_UNSET_KEY" in err.value.message
    assert chat_server.requests == []


async def test_a_model_step_asks_the_endpoint_one_turn_with_no_tools(chat_server: ChatServer) -> None:
    chat_server.script(reply("hello"))
    spec = _spec(chat_server)
    resp = await make_chat_model(spec).complete_chat(
        prompt_request(spec, run_id="r", step_id="ask", attempt=1, prompt="packed prompt", prompt_tokens=3))
    assert (resp.text, resp.input_tokens, resp.output_tokens, resp.model) == ("hello", 12, 7, "loopback-1")
    assert chat_server.requests[0].body == {"model": "loopback-model", "temperature": 0,
                                            "messages": [{"role": "user", "content": "packed prompt"}]}


async def test_a_server_without_usage_is_counted(chat_server: ChatServer) -> None:
    spec = _spec(chat_server)
    chat_server.script(reply("an answer of some words", usage=None))
    resp: ChatResponse = await make_chat_model(spec).complete_chat(_turn1(spec))
    assert resp.input_tokens > 0 and resp.output_tokens > 0 and resp.cost_usd > 0


async def test_a_reused_request_is_the_one_the_sdk_builds_with_the_new_body(chat_server: ChatServer) -> None:
    """Streamed calls after the first reuse the first one's request (built by the SDK) with their own body: the
    server sees the headers a plain SDK client sends, ``Content-Length`` that body's, and the body exactly."""
    spec = _spec(chat_server, stream=True, api_key_env="REEL_TEST_REUSED_KEY")
    model = make_chat_model(spec)
    chat_server.script(streamed("one", chunks=4), streamed("two", chunks=4), streamed("three", chunks=4))
    os.environ["REEL_TEST_REUSED_KEY"] = "sk-reused-" + uuid.uuid4().hex
    try:
        texts = []
        for i, words in enumerate(("short", "a much longer task text " * 20)):
            req = chat_request(spec, run_id="r-1", step_id=f"solve:t{i + 1}", turn=i + 1, tools=TOOLS, messages=[
                ChatMessage(role="system", content="You fix bugs."), ChatMessage(role="user", content=words)])
            texts.append((await model.complete_chat(req)).text)
            assert chat_server.requests[-1].body == wire_request(req)
        pooled = CLIENTS.get(chat_server.url, os.environ["REEL_TEST_REUSED_KEY"], 10.0)
        assert list(pooled.__dict__.get("_templates", {})) == [("post", "/chat/completions")]  # the copy path ran
        sdk = openai.AsyncOpenAI(api_key=os.environ["REEL_TEST_REUSED_KEY"], base_url=chat_server.url, timeout=10.0,
                                 max_retries=0, http_client=openai.DefaultAioHttpClient())
        async with sdk:
            content = msgspec.json.encode(wire_request(req))
            stream = await sdk.post("/chat/completions", content=content, cast_to=object, stream=True,
                                    stream_cls=openai.AsyncStream[object])
            async with stream:
                async for _ in stream:
                    pass
    finally:
        del os.environ["REEL_TEST_REUSED_KEY"]
    assert texts == ["one", "two"]
    first, second, plain = (r.headers for r in chat_server.requests)
    assert second["Authorization"].startswith("Bearer sk-reused-")
    assert int(first["Content-Length"]) < int(second["Content-Length"]) == len(content)
    same = {k: v for k, v in plain.items() if k != "Content-Length"}
    for got in (first, second):
        assert {k: v for k, v in got.items() if k != "Content-Length"} == same


async def test_calls_reuse_one_client_and_its_connection(chat_server: ChatServer) -> None:
    """A client (connection pool, TLS context) per call cost most of an agent turn's CPU: calls to one endpoint
    share one client and its kept-alive connection; another endpoint gets its own."""
    spec = _spec(chat_server)
    model = make_chat_model(spec)
    chat_server.script(reply("one"), reply("two"), reply("three"))
    for _ in range(3):
        assert (await model.complete_chat(_turn1(spec))).text in ("one", "two", "three")
    assert len({r.peer for r in chat_server.requests}) == 1, [r.peer for r in chat_server.requests]
    assert chat_server.url.endswith("/v1")
    one = CLIENTS.get(chat_server.url, PLACEHOLDER_KEY, 10.0)
    assert CLIENTS.get(chat_server.url, PLACEHOLDER_KEY, 10.0) is one  # the pool's, not a new one
    assert 1 <= CLIENTS.size() <= CLIENTS.max_clients
    other = CLIENTS.get(chat_server.url.replace("127.0.0.1", "localhost"), PLACEHOLDER_KEY, 10.0)
    assert other is not one and CLIENTS.get(chat_server.url, "another-key", 10.0) is not one
