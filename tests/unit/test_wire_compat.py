"""The request bytes per server: the content beside tool calls, tool_choice, parallel_tool_calls and
streaming of tool turns, from a spec's ``profile`` and ``compat`` (docs/models.md, "Servers and profiles")."""

from __future__ import annotations

import msgspec
import pytest

from reel.shared.core.chat.messages import ChatMessage, ToolCall, ToolSchema, chat_request, wire_request
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.modelcompat import PROFILES, Compat
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow

READ = ToolSchema(name="read_file", parameters={"type": "object", "properties": {"path": {"type": "string"}}})
CALL = ToolCall(id="call_1", name="read_file", arguments='{"path":"a.py"}')
AFTER_A_TOOL = (ChatMessage(role="user", content="fix it"), ChatMessage(role="assistant", tool_calls=(CALL,)),
                ChatMessage(role="tool", tool_call_id="call_1", content="x = 1"))


def _body(spec: ModelSpec, tools: tuple[ToolSchema, ...] = (READ,)) -> bytes:
    return msgspec.json.encode(wire_request(chat_request(spec, run_id="r", step_id="s:t2", messages=AFTER_A_TOOL,
                                                         tools=tools)))


def _spec(**kw: object) -> ModelSpec:
    return msgspec.convert({"adapter": "openai", "base_url": "http://h/v1", "model": "m", **kw}, ModelSpec)


def test_the_default_body_after_a_tool_call_is_what_every_listed_server_accepts() -> None:
    assert _body(_spec()) == (
        b'{"model":"m","messages":[{"role":"user","content":"fix it"},'
        b'{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function",'
        b'"function":{"name":"read_file","arguments":"{\\"path\\":\\"a.py\\"}"}}]},'
        b'{"role":"tool","content":"x = 1","tool_call_id":"call_1"}],'
        b'"tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object",'
        b'"properties":{"path":{"type":"string"}}}}}],"tool_choice":"auto"}')


@pytest.mark.parametrize(("setting", "assistant"), [
    ("empty", b'{"role":"assistant","content":"","tool_calls":'),
    ("null", b'{"role":"assistant","content":null,"tool_calls":'),
    ("omit", b'{"role":"assistant","tool_calls":'),
])
def test_the_content_beside_tool_calls_is_the_compat_setting(setting: str, assistant: bytes) -> None:
    assert assistant in _body(_spec(compat={"tool_call_content": setting}))


def test_text_beside_tool_calls_and_messages_without_text_are_unchanged_by_the_setting() -> None:
    spoken = ChatMessage(role="assistant", content="Reading.", tool_calls=(CALL,))
    for setting in ("empty", "null", "omit"):
        spec = _spec(compat={"tool_call_content": setting})
        req = chat_request(spec, run_id="r", step_id="s", messages=[spoken, ChatMessage(role="user")])
        messages = wire_request(req)["messages"]
        assert messages[0]["content"] == "Reading." and messages[1] == {"role": "user", "content": ""}


def test_tool_choice_is_auto_when_tools_are_offered_unless_the_workflow_sets_another() -> None:
    assert wire_request(chat_request(_spec(), run_id="r", step_id="s", messages=(), tools=(READ,)))[
        "tool_choice"] == "auto"
    assert "tool_choice" not in wire_request(chat_request(_spec(), run_id="r", step_id="s", messages=()))
    forced = {"type": "function", "function": {"name": "read_file"}}
    body = wire_request(chat_request(_spec(params={"tool_choice": forced}), run_id="r", step_id="s", messages=(),
                                     tools=(READ,)))
    assert body["tool_choice"] == forced
    assert wire_request(chat_request(_spec(params={"tool_choice": "required"}), run_id="r", step_id="s",
                                     messages=(), tools=(READ,)))["tool_choice"] == "required"


def test_the_llama_cpp_python_profile_sends_one_call_per_turn_and_streams_no_tool_turn() -> None:
    spec = _spec(profile="llama-cpp-python", stream=True)
    tool_turn = chat_request(spec, run_id="r", step_id="s:t1", messages=AFTER_A_TOOL, tools=(READ,))
    body = wire_request(tool_turn)
    assert not tool_turn.stream and "stream" not in body and "stream_options" not in body
    assert list(body)[-2:] == ["tool_choice", "parallel_tool_calls"] and body["parallel_tool_calls"] is False
    assert body["messages"][1]["content"] == ""
    plain = chat_request(spec, run_id="r", step_id="s:t1", messages=AFTER_A_TOOL)  # no tools offered: streamed
    assert wire_request(plain)["stream_options"] == {"include_usage": True}
    assert "parallel_tool_calls" not in wire_request(plain)
    override = _spec(profile="llama-cpp-python", stream=True, compat={"stream_tool_turns": True},
                     params={"parallel_tool_calls": True})
    body = wire_request(chat_request(override, run_id="r", step_id="s", messages=(), tools=(READ,)))
    assert body["stream"] is True and body["parallel_tool_calls"] is True  # compat and params over the profile


def test_the_other_profiles_are_the_defaults_and_streaming_specs_stream_tool_turns() -> None:
    default = _body(_spec(stream=True))
    assert b'"stream":true,"stream_options":{"include_usage":true}}' in default
    for name in ("openai", "vllm", "llama-server", "ollama", "litellm"):
        assert _body(_spec(profile=name, stream=True)) == default, name
    assert set(PROFILES) >= {"openai", "vllm", "llama-server", "llama-cpp-python", "ollama", "litellm"}


def test_profiles_and_compat_are_checked_and_leave_older_workflows_unchanged() -> None:
    def wf(model: dict[str, object]) -> dict[str, object]:
        return {"name": "w", "steps": [{"id": "a", "kind": "model",
                                        "model": {"adapter": "openai", "base_url": "http://h/v1", "model": "m",
                                                  **model}}]}
    with pytest.raises(WorkflowInvalid, match=r"unknown model profile 'llamacpp'.*llama-cpp-python.*"
                                              r"steps\[0\]\.model\.profile"):
        parse_workflow(wf({"profile": "llamacpp"}))
    with pytest.raises(WorkflowInvalid, match="tool_call_content"):
        parse_workflow(wf({"compat": {"tool_call_content": "none"}}))
    with pytest.raises(WorkflowInvalid, match="stream_tools"):
        parse_workflow(wf({"compat": {"stream_tools": False}}))
    spec = parse_workflow(wf({"profile": "ollama", "compat": {"tool_call_content": "omit"}}))
    assert spec.steps[0].model is not None and spec.steps[0].model.compat == Compat(tool_call_content="omit")
    assert b"profile" not in encode_workflow(parse_workflow(wf({})))  # unset: encoded (and hashed) as before
