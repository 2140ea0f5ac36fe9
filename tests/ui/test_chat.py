"""Prompts and outputs as a conversation, without a browser: a chat-completions request as its messages (tool calls
with their arguments, a tool result named by the call it answers), a response message, what is not one, and the
conversation rendered (escaped) by the run page's template."""

from __future__ import annotations

import json

from reel.services.ui.app import _env
from reel.services.ui.chat import Call, Conversation, Message, as_message, conversation
from reel.shared.core.chat.messages import ChatMessage, ChatRequest, ToolCall, ToolSchema, wire_request


def test_a_request_as_sent_reads_as_its_messages() -> None:
    req = ChatRequest(run_id="r", step_id="a:t2", model="m-1", tools=(ToolSchema(name="read_file"),), messages=(
        ChatMessage(role="system", content="Be careful.\nAlways."),
        ChatMessage(role="user", content="<context id='task'>\nFix <b>it</b>\n</context>"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id="c1", name="read_file", arguments='{"path":"a.py"}'),
                                                  ToolCall(id="c2", name="read_file", arguments="{oops"))),
        ChatMessage(role="tool", tool_call_id="c1", content="x = 1\n"),
        ChatMessage(role="tool", tool_call_id="c2", content="error (invalid_arguments): not JSON"),
        ChatMessage(role="tool", tool_call_id="c9", content="who asked?")))
    body = json.dumps(wire_request(req)).encode()
    c = conversation(body)
    assert c is not None and (c.kind, c.model, c.tools) == ("request", "m-1", ("read_file",))
    assert dict(c.params) == {"tool_choice": '"auto"'}
    assert [m.role for m in c.messages] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert c.messages[0].content == "Be careful.\nAlways."  # a real newline, not "\n"
    assert c.messages[2].calls == (Call(call_id="c1", name="read_file", arguments='{"path":"a.py"}', valid=True,
                                        fields=(("path", "a.py"),)),
                                   Call(call_id="c2", name="read_file", arguments="{oops", valid=False))
    assert [(m.tool_call_id, m.tool_name) for m in c.messages[3:]] == [("c1", "read_file"), ("c2", "read_file"),
                                                                       ("c9", "")]
    html = _env().get_template("_chat.html").render(c=c, why="")
    assert "Fix &lt;b&gt;it&lt;/b&gt;" in html and "<b>it</b>" not in html  # text, never markup
    assert html.count('class="msg ') == 6 and 'data-tool-call-id="c1"' in html and "arguments are not" in html


def test_a_response_message_and_what_is_not_a_conversation() -> None:
    msg = {"role": "assistant", "content": [{"type": "text", "text": "Part one."}, {"type": "image_url"}],
           "tool_calls": [{"id": "k", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
           "refusal": None, "name": "bot"}
    c = conversation(json.dumps(msg).encode())
    assert c is not None and c.kind == "message"
    assert c.messages == (Message(role="assistant", content='Part one.\n\n{"type": "image_url"}', calls=(
        Call(call_id="k", name="f", arguments='{"a": 1}', valid=True, fields=(("a", "1"),)),),
        extra=(("name", '"bot"'),)),)
    for body in (b"plain text", b"[1, 2]", b'{"messages": []}', b'{"messages": [{"content": "no role"}]}',
                 b"\xff\xfe", b'{"model": "m"}', b"[" * 100_000):
        assert conversation(body) is None, body[:20]
    html = _env().get_template("_chat.html").render(c=None, why="not a chat request or message")
    assert "not shown as a conversation: not a chat request or message" in html


def test_a_text_body_as_one_message() -> None:
    text = "Write a command.\n\n<context id='task'>\nGreet.\n</context>"
    assert as_message(text.encode(), "user") == Conversation(kind="text", messages=(Message(role="user",
                                                                                           content=text),))
    assert as_message(b'{"role": "assistant", "content": "hi"}', "assistant").kind == "message"  # type: ignore[union-attr]
    assert as_message(b"\xff\xfe", "user") is None
    html = _env().get_template("_chat.html").render(c=as_message(b"<b>x</b>", "assistant"), why="")
    assert "the model&#39;s text" in html and "&lt;b&gt;x&lt;/b&gt;" in html
