"""Streamed responses, pure: the request asks for a stream, the chunks assemble into the message a
non-streamed call returns (tool-call fragments by index), a stream without its finish is broken, specs are checked."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from reel.shared.core.chat.chunks import StreamAssembler, broken
from reel.shared.core.chat.messages import ChatMessage, chat_request, response_from_wire, wire_request
from reel.shared.core.errors import ModelError, WorkflowInvalid
from reel.shared.core.wire.livemessages import StreamChunk, ToolCallDelta, decode_chunk, encode_live
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow

SPEC = ModelSpec(adapter="openai", base_url="http://h/v1", model="m", stream=True, params={"temperature": 0})


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c-1", "object": "chat.completion.chunk", "model": "m-2", "choices": choices, **top}


def test_a_streaming_spec_asks_for_a_stream_with_usage_last_in_the_body() -> None:
    req = chat_request(SPEC, run_id="r", step_id="s:t1", messages=[ChatMessage(role="user", content="x")])
    body = wire_request(req)
    assert req.stream and list(body) == ["model", "messages", "temperature", "stream", "stream_options"]
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})
    plain = msgspec.structs.replace(SPEC, stream=msgspec.UNSET)
    assert "stream" not in wire_request(chat_request(plain, run_id="r", step_id="s", messages=()))


def test_chunks_assemble_into_the_message_a_plain_call_returns() -> None:
    acc = StreamAssembler()
    frames = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Looking "}), chunk({"content": "it up."}),
        chunk({"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "run",
                                                                                      "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "read",
                                                                                      "arguments": '{"pa'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "x"}'}}]}),
        chunk({}, "tool_calls"),
        chunk(None, usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}),
    ]
    out = [acc.add(f) for f in frames]
    assert out[0] is None and out[-2] is None and out[-1] is None  # role only, finish only, usage only
    assert out[1] == StreamChunk(seq=0, content="Looking ")
    assert out[4] == StreamChunk(seq=0, tool_calls=(ToolCallDelta(index=0, id="a", name="read", arguments='{"pa'),))
    body = acc.body()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Looking it up.", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "read", "arguments": '{"path": "x"}'}},
        {"id": "b", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}
    resp = response_from_wire(body, turn=1, spec=SPEC)
    assert [c.id for c in resp.tool_calls] == ["a", "b"] and resp.finish_reason == "tool_calls"
    assert (resp.input_tokens, resp.output_tokens, resp.model) == (30, 9, "m-2")
    assert resp.message == body["choices"][0]["message"]  # the output blob: the assembled message


def test_a_tool_only_answer_has_null_content_and_a_stream_without_its_finish_is_broken() -> None:
    acc = StreamAssembler()
    acc.add(chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "a", "function": {"name": "f"}}]}))
    assert acc.message()["content"] is None
    with pytest.raises(ModelError) as err:
        acc.body()
    assert (err.value.kind, err.value.retryable) == ("stream_broken", True) and "after 1 chunks" in err.value.message
    assert broken(10, "peer closed").message == "the response stream broke: after 10 chunks: peer closed"
    with pytest.raises(ModelError) as bad:
        StreamAssembler().add(chunk({"content": "x"}) | {"choices": {"no": "list"}})
    assert bad.value.kind == "malformed_response"


def test_stream_chunks_round_trip_and_leave_defaults_out() -> None:
    c = StreamChunk(seq=3, tool_calls=(ToolCallDelta(index=0, arguments='{"k'),))
    assert encode_live(c) == b'{"seq":3,"tool_calls":[{"index":0,"arguments":"{\\"k"}]}'
    assert decode_chunk(encode_live(c)) == c


def _step(model: dict[str, Any]) -> dict[str, Any]:
    return {"name": "w", "steps": [{"kind": "model", "id": "a", "model": model}]}


@pytest.mark.parametrize(("model", "field"), [
    ({"adapter": "scripted", "outputs": ["x"], "stream": True}, "`$.steps[0].model.stream`"),
    ({"adapter": "openai", "model": "m", "base_url": "http://h", "params": {"stream_options": {}}},
     "`$.steps[0].model.params.stream_options`"),
])
def test_stream_is_refused_where_it_cannot_apply(model: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkflowInvalid) as err:
        parse_workflow(_step(model))
    assert field in err.value.message


def test_stream_is_kept_in_the_workflow_and_absent_when_unset() -> None:
    spec = parse_workflow(_step({"adapter": "openai", "model": "m", "base_url": "http://h", "stream": True}))
    assert msgspec.json.decode(encode_workflow(spec))["steps"][0]["model"]["stream"] is True
    assert parse_workflow(_step({"adapter": "my.mod:factory", "stream": True})).steps[0].model.streams  # type: ignore[union-attr]
    plain = parse_workflow(_step({"adapter": "openai", "model": "m", "base_url": "http://h"}))
    assert "stream" not in msgspec.json.decode(encode_workflow(plain))["steps"][0]["model"]
