"""The model port's chat types, the wire format, call ids, prices, and the scripted/replay chat models."""

from __future__ import annotations

import msgspec
import pytest

from reel.shared.core.chat.messages import (
    ChatMessage,
    ChatRequest,
    ToolCall,
    ToolSchema,
    assign_call_ids,
    chat_request,
    prompt_request,
    response_from_wire,
    wire_request,
)
from reel.shared.core.errors import ModelError, ToolCallInvalid, WorkflowInvalid
from reel.shared.core.workflow.modelspec import ModelSpec, Price
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow
from reel.shared.models import make_chat_model

READ = ToolSchema(name="read_file", description="Read a file.",
                  parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})


def _req(*messages: ChatMessage, turn: int = 1, attempt: int = 1, tools: tuple[ToolSchema, ...] = (READ,),
         params: dict[str, object] | None = None) -> ChatRequest:
    return ChatRequest(run_id="r-1", step_id="solve", turn=turn, attempt=attempt, messages=messages, tools=tools,
                       params=dict(params or {}), model="m-1")


def test_wire_request_is_the_chat_completions_body() -> None:
    call = ToolCall(id="call_9", name="read_file", arguments='{"path": "a.py"}')
    req = _req(ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="fix it"),
               ChatMessage(role="assistant", tool_calls=(call,)),
               ChatMessage(role="tool", tool_call_id="call_9", content="print('hi')"),
               params={"temperature": 0, "model": "ignored"})
    assert wire_request(req) == {
        "model": "m-1",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_9", "type": "function",
                 "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
            {"role": "tool", "content": "print('hi')", "tool_call_id": "call_9"},
        ],
        "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                                    "parameters": READ.parameters}}],
        "temperature": 0,
        "tool_choice": "auto",
    }
    # stable order, stable blob
    assert list(wire_request(req)) == ["model", "messages", "tools", "temperature", "tool_choice"]
    assert "tools" not in wire_request(_req(ChatMessage(role="user", content="x"), tools=()))


def test_call_ids_are_kept_unless_empty_or_repeated() -> None:
    calls = [ToolCall(id="a", name="t"), ToolCall(id="", name="t"), ToolCall(id="a", name="t"),
             ToolCall(id="call_t3_3", name="t"), ToolCall(id="old", name="t")]
    ids = [c.id for c in assign_call_ids(calls, turn=3, taken={"old"})]
    assert ids == ["a", "call_t3_1", "call_t3_2", "call_t3_3", "call_t3_4"]
    assert assign_call_ids(calls, turn=3, taken={"old"}) == assign_call_ids(calls, turn=3, taken={"old"})
    clash = [ToolCall(id="call_t1_1", name="t"), ToolCall(id="", name="t")]
    assert [c.id for c in assign_call_ids(clash, turn=1)] == ["call_t1_1", "call_t1_1_1"]


def test_arguments_parse_or_say_which_call_is_broken() -> None:
    assert ToolCall(id="c", name="t", arguments='{"x": 1}').parsed_arguments() == {"x": 1}
    assert ToolCall(id="c", name="t", arguments="  ").parsed_arguments() == {}
    with pytest.raises(ToolCallInvalid) as bad:
        ToolCall(id="c7", name="read_file", arguments='{"path": ').parsed_arguments()
    assert "c7" in bad.value.message and "read_file" in bad.value.message and "not valid JSON" in bad.value.message
    assert (bad.value.call_id, bad.value.name) == ("c7", "read_file")
    with pytest.raises(ToolCallInvalid, match="must be a JSON object, got list"):
        ToolCall(id="c", name="t", arguments="[1]").parsed_arguments()


def test_price_is_per_million_tokens() -> None:
    assert Price(input_usd_per_mtok=0.15, output_usd_per_mtok=0.60).cost_usd(1_000_000, 500_000) == 0.45
    assert Price(input_usd_per_mtok=2.5).cost_usd(1200, 0) == 0.003
    assert ModelSpec(adapter="scripted", outputs=("x",)).cost_usd(10**6, 10**6) == 0.0


def test_response_reading_keeps_the_message_and_fails_empty_ones() -> None:
    spec = ModelSpec(adapter="openai", base_url="http://h/v1", model="m", price=Price(input_usd_per_mtok=1e6))
    msg = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "", "type": "function", "function": {"name": "t", "arguments": {"k": 1}}}], "extra": "kept"}
    resp = response_from_wire({"model": "m-x", "choices": [{"message": msg, "finish_reason": "tool_calls"}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1}}, turn=2, spec=spec)
    assert resp.message == msg and resp.text == "" and resp.model == "m-x" and resp.finish_reason == "tool_calls"
    assert resp.tool_calls == (ToolCall(id="call_t2_0", name="t", arguments='{"k":1}'),)
    assert (resp.input_tokens, resp.output_tokens, resp.cost_usd) == (3, 1, 3.0)
    assert resp.assistant_message() == ChatMessage(role="assistant", tool_calls=resp.tool_calls)
    for body, kind in [({"choices": []}, "empty_response"),
                       ({"choices": [{"message": {"role": "assistant", "content": ""}}], "usage": {
                           "prompt_tokens": 2}}, "empty_response"),
                       ({"choices": [{"message": "x"}]}, "malformed_response"),
                       ({"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}, "malformed_response")]:
        with pytest.raises(ModelError) as err:
            response_from_wire(body, turn=1, spec=spec)
        assert (err.value.kind, err.value.retryable) == (kind, True)
    with pytest.raises(ModelError) as billed:
        response_from_wire({"choices": [], "usage": {"prompt_tokens": 2}}, turn=1, spec=spec)
    assert billed.value.cost_usd == 2.0


SCRIPTED = {"adapter": "scripted", "turns": [
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "calc.py"}}, {"name": "run_tests", "id": "p1"}],
     "failures": [{"error": "rate_limited", "message": "429 scripted"}]},
    {"text": "calls", "tool_calls": [{"name": "read_file", "arguments": '{"path": '}]},
    {"text": "Fixed."},
]}


async def test_scripted_turns_play_by_turn_and_attempt() -> None:
    model = make_chat_model(msgspec.convert(SCRIPTED, ModelSpec))
    with pytest.raises(ModelError) as err:
        await model.complete_chat(_req(ChatMessage(role="user", content="go")))
    assert (err.value.kind, err.value.message, err.value.retryable) == ("rate_limited", "429 scripted", True)
    t1 = await model.complete_chat(_req(ChatMessage(role="user", content="go"), attempt=2))
    assert [(c.id, c.name, c.arguments) for c in t1.tool_calls] == [
        ("call_t1_0", "read_file", '{"path":"calc.py"}'), ("p1", "run_tests", "{}")]
    assert t1.message["tool_calls"][0]["id"] == "" and t1.finish_reason == "tool_calls"  # as "the provider" sent it
    t2 = await model.complete_chat(_req(ChatMessage(role="user", content="go"), turn=2))
    assert t2.text == "calls" and t2.tool_calls[0].arguments == '{"path": '
    for turn in (3, 9):  # the last turn repeats
        last = await model.complete_chat(_req(ChatMessage(role="user", content="go"), turn=turn))
        assert (last.text, last.tool_calls, last.finish_reason) == ("Fixed.", (), "stop")
        assert last.message == {"role": "assistant", "content": "Fixed."} and last.input_tokens > 0


async def test_scripted_outputs_play_by_attempt_as_a_model_step_asks() -> None:
    spec = msgspec.convert({"adapter": "scripted", "outputs": [{"error": "boom"}, "second"]}, ModelSpec)
    model = make_chat_model(spec)
    with pytest.raises(ModelError):
        await model.complete_chat(prompt_request(spec, run_id="r", step_id="s", attempt=1, prompt="p", prompt_tokens=1))
    ok = await model.complete_chat(prompt_request(spec, run_id="r", step_id="s", attempt=2, prompt="p",
                                                  prompt_tokens=1))
    assert (ok.text, ok.input_tokens, ok.tool_calls, ok.usage_source) == ("second", 1, (), "estimated")
    chat = await model.complete_chat(_req(ChatMessage(role="user", content="go"), attempt=5))
    assert (chat.text, chat.tool_calls) == ("second", ())
    turns_only = msgspec.convert(SCRIPTED, ModelSpec)  # a model step on a turns script: turn 1 (attempt 1 fails)
    with pytest.raises(ModelError):
        await make_chat_model(turns_only).complete_chat(prompt_request(
            turns_only, run_id="r", step_id="s", attempt=1, prompt="p", prompt_tokens=1))


def test_a_model_steps_request_is_one_turn_with_its_prompt_as_the_one_user_message() -> None:
    spec = ModelSpec(adapter="openai", base_url="http://h/v1", model="qwen", params={"temperature": 0})
    req = prompt_request(spec, run_id="r", step_id="ask", attempt=3, prompt="packed prompt", prompt_tokens=7)
    assert (req.turn, req.attempt, req.tools, req.prompt_tokens) == (1, 3, (), 7)
    assert wire_request(req) == {"model": "qwen", "temperature": 0,
                                 "messages": [{"role": "user", "content": "packed prompt"}]}


async def test_a_factory_without_the_chat_port_is_refused_saying_what_it_lacks() -> None:
    with pytest.raises(ModelError) as err:
        make_chat_model(ModelSpec(adapter="tests.unit.test_chat:_old_style"))
    assert err.value.kind == "adapter_unavailable" and not err.value.retryable
    assert "complete_chat" in err.value.message and "_OldStyle" in err.value.message


async def test_replay_plays_recorded_turns_with_their_usage() -> None:
    spec = msgspec.convert({"adapter": "replay", "turns": [
        {"tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}, "id": "toolu_1"}],
         "usage": {"input_tokens": 100, "output_tokens": 9, "cost_usd": 0.01}}, {"text": "done"}]}, ModelSpec)
    model = make_chat_model(spec)
    t1 = await model.complete_chat(_req(ChatMessage(role="user", content="go")))
    assert (t1.tool_calls[0].id, t1.input_tokens, t1.output_tokens, t1.cost_usd) == ("toolu_1", 100, 9, 0.01)
    assert (await model.complete_chat(_req(ChatMessage(role="user", content="go"), turn=2))).text == "done"
    plain = make_chat_model(ModelSpec(adapter="replay", output="recorded"))
    assert (await plain.complete_chat(_req(ChatMessage(role="user", content="q")))).text == "recorded"


class _OldStyle:
    """An adapter of a port Reel no longer has (``complete(prompt)``)."""

    name = "old"

    async def complete(self, request: object) -> object:
        return request


def _old_style(spec: ModelSpec, counter: object) -> _OldStyle:
    return _OldStyle()


def test_chat_request_takes_model_and_params_from_the_spec() -> None:
    spec = ModelSpec(adapter="openai", base_url="http://h/v1", model="qwen", params={"temperature": 0})
    req = chat_request(spec, run_id="r", step_id="s:t1", messages=[ChatMessage(role="user", content="x")], turn=2)
    assert (req.model, req.params, req.turn, req.attempt) == ("qwen", {"temperature": 0}, 2, 1)
    assert chat_request(ModelSpec(adapter="scripted", outputs=("x",), name="n"), run_id="r", step_id="s",
                        messages=()).model == "n"


def _model_step(model: dict[str, object]) -> dict[str, object]:
    return {"name": "w", "steps": [{"kind": "model", "id": "a", "model": model}]}


@pytest.mark.parametrize(("model", "field"), [
    ({"adapter": "openai", "base_url": "http://h/v1"}, "`$.steps[0].model.model`"),
    ({"adapter": "openai", "model": "m"}, "`$.steps[0].model.base_url`"),
    ({"adapter": "openai", "model": "m", "base_url": "h:8000"}, "`$.steps[0].model.base_url`"),
    ({"adapter": "openai", "model": "m", "base_url": "http://h", "params": {"stream": True}},
     "`$.steps[0].model.params.stream`"),
    ({"adapter": "openai", "model": "m", "base_url": "http://h", "api_key_env": "sk-123"},
     "`$.steps[0].model.api_key_env`"),
    ({"adapter": "openai", "model": "m", "base_url": "http://h", "timeout_s": 0}, "`$.steps[0].model.timeout_s`"),
    ({"adapter": "openai", "model": "m", "base_url": "http://h", "price": {"input_usd_per_mtok": -1}},
     "`$.steps[0].model.price.input_usd_per_mtok`"),
    ({"adapter": "scripted", "turns": [{"failures": [{"error": "x"}]}]}, "`$.steps[0].model.turns[0]`"),
    ({"adapter": "scripted", "turns": [{"tool_calls": [{"name": ""}]}]},
     "`$.steps[0].model.turns[0].tool_calls[0].name`"),
    ({"adapter": "scripted", "turns": [{"text": "x", "extra": 1}]}, "`extra` - at `$.steps[0].model.turns[0]`"),
])
def test_bad_model_specs_are_refused_naming_the_field(model: dict[str, object], field: str) -> None:
    with pytest.raises(WorkflowInvalid) as err:
        parse_workflow(_model_step(model))
    assert field in err.value.message


def test_workflows_without_the_new_fields_encode_as_before() -> None:
    spec = parse_workflow(_model_step({"adapter": "scripted", "outputs": ["x"]}))
    assert msgspec.json.decode(encode_workflow(spec))["steps"][0]["model"] == {
        "adapter": "scripted", "output": None, "outputs": ["x"], "usage": None, "name": ""}
    full = parse_workflow(_model_step({"adapter": "openai", "model": "m", "base_url": "http://h/v1",
                                       "timeout_s": 5, "price": {"input_usd_per_mtok": 1}}))
    assert parse_workflow(encode_workflow(full)) == full
