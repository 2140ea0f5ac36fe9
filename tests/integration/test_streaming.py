"""Streamed tokens: a model spec with ``stream: true`` against the loopback server streaming real
server-sent events over real HTTP, the real executor, a core-NATS subscriber on the stream subjects. No mocks.

The subscriber sees each attempt's fragments in order (``seq`` 0, 1, …, the last one ``done``); the log keeps only
the consolidated response — the output blob is the assembled message, and equals the concatenation of what was
streamed; the prompt blob is the exact body sent, stream fields included. A stream cut mid-way is a failed,
retryable attempt, and the retry streams on its own subject.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from reel.shared.core.wire.livemessages import StreamChunk, decode_chunk
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO
from tests.integration.agent_support import LOOKUP, start_and_rest
from tests.integration.scenarios import attempt_of
from tests.refold import assert_refold_identical
from tests.support.chat_server import ChatServer, call, streamed

TEXT = "Let me look that up for you now."
CALL = call("lookup", {"key": "answer"}, id="call_lookup_1")


class Streams:
    """Every stream message of the namespace, by subject, in arrival order; ``ended(subject)`` waits for its last."""

    def __init__(self) -> None:
        self.by_subject: dict[str, list[StreamChunk]] = defaultdict(list)
        self._done: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def on_msg(self, msg: Msg) -> None:
        chunk = decode_chunk(msg.data)
        self.by_subject[msg.subject].append(chunk)
        if chunk.done:
            self._done[msg.subject].set()

    async def ended(self, subject: str) -> list[StreamChunk]:
        await asyncio.wait_for(self._done[subject].wait(), 10)
        return self.by_subject[subject]


@pytest.fixture
async def streams(infra: Infra, cfg: Config) -> AsyncIterator[Streams]:
    s = Streams()
    sub = await infra.nc.subscribe(f"{cfg.names.namespace}.stream.>", cb=s.on_msg)
    try:
        yield s
    finally:
        await sub.unsubscribe()


def _model(server: ChatServer) -> dict[str, Any]:
    return {"adapter": "openai", "base_url": server.url, "model": "loopback-1", "timeout_s": 10, "stream": True,
            "params": {"temperature": 0}}


def _agent(server: ChatServer) -> dict[str, Any]:
    return {"name": "streamed-agent", "steps": [{
        "kind": "agent", "id": "solve", "instructions": "Use the tools, then answer.", "max_attempts": 2,
        "context": [{"id": "task", "kind": "task", "text": "What is the answer?"}],
        "model": _model(server), "tools": [LOOKUP]}]}


def _in_order(chunks: list[StreamChunk]) -> tuple[str, dict[int, str], StreamChunk]:
    """Check seq 0, 1, … with one ``done`` at the end; the streamed text, tool-call arguments by index, the end."""
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    args: dict[int, str] = defaultdict(str)
    for c in chunks[:-1]:
        for t in c.tool_calls:
            args[t.index] += t.arguments
    return "".join(c.content for c in chunks[:-1]), dict(args), chunks[-1]


async def test_a_streamed_turn_reaches_a_subscriber_in_order_and_the_log_keeps_the_whole_response(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, cfg: Config,
    chat_server: ChatServer, streams: Streams,
) -> None:
    # turn 1: 20 chunks, the text and the tool call's arguments split across them; turn 2: a short answer
    chat_server.script(streamed(TEXT, [CALL], chunks=20), streamed("The answer is 42.", chunks=6))
    state = await start_and_rest(client, parse_workflow(_agent(chat_server)))
    assert state.status == "verifying", state.status
    subject = cfg.names.stream(state.run_id, "main", "solve:t1", 1)
    assert subject == f"{cfg.names.namespace}.stream.{state.run_id}.main.solve:t1.1"  # ':' is a legal token
    chunks = await streams.ended(subject)
    text, args, end = _in_order(chunks)
    assert len(chunks) == 18 + 1  # 20 chunks less the role-only and the finish-only ones, plus the end
    assert (end.finish_reason, end.error) == ("tool_calls", None)
    assert [t.name for c in chunks for t in c.tool_calls if t.name] == ["lookup"]
    assert [t.id for c in chunks for t in c.tool_calls if t.id] == ["call_lookup_1"]

    # the log keeps the consolidated response: the assembled message, equal to the concatenation
    t1 = attempt_of(state, "solve:t1", 1)
    assert t1.output_ref is not None and t1.prompt_ref is not None
    message = json.loads(await blobs.get(t1.output_ref))
    assert message == {"role": "assistant", "content": TEXT, "tool_calls": [
        {"id": "call_lookup_1", "type": "function", "function": {"name": "lookup", "arguments": args[0]}}]}
    assert text == TEXT and json.loads(args[0]) == {"key": "answer"}
    assert (t1.usage.input_tokens, t1.usage.output_tokens) == (12, 7)  # from the usage chunk
    # the prompt blob is still the exact body sent, now with the stream fields
    sent = chat_server.requests[0].body
    assert json.loads(await blobs.get(t1.prompt_ref)) == sent
    assert (sent["stream"], sent["stream_options"]) == (True, {"include_usage": True})
    # the tool ran on the assembled arguments, and turn 2 streamed too
    second = chat_server.requests[1].body["messages"]
    assert second[-1]["role"] == "tool" and json.loads(second[-1]["content"])["value"] == "42"
    text2, _, end2 = _in_order(await streams.ended(cfg.names.stream(state.run_id, "main", "solve:t2", 1)))
    assert text2 == "The answer is 42." and end2.finish_reason == "stop"
    await assert_refold_identical(event_log, state)


async def test_a_stream_cut_mid_way_is_a_failed_attempt_and_the_retry_succeeds(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, cfg: Config,
    chat_server: ChatServer, streams: Streams,
) -> None:
    chat_server.script(streamed(TEXT, [CALL], chunks=20, cut_at=10), streamed(TEXT, [CALL], chunks=20),
                       streamed("The answer is 42.", chunks=6))
    state = await start_and_rest(client, parse_workflow(_agent(chat_server)))
    assert state.status == "verifying", state.status
    first, second = state.branches["main"].attempts["solve:t1"]
    assert (first.status, first.error_kind, first.retryable) == ("failed", "stream_broken", True)
    assert "after 10 chunks" in (first.error_message or "")
    assert second.status == "succeeded"
    # the subscriber saw attempt 1 break after its 10th chunk (the role chunk carries no fragment) ...
    broken = await streams.ended(cfg.names.stream(state.run_id, "main", "solve:t1", 1))
    text1, _, end1 = _in_order(broken)
    assert len(broken) == 9 + 1 and (end1.error, end1.finish_reason) == ("stream_broken", None)
    assert TEXT.startswith(text1) and text1 != TEXT
    # ... and attempt 2 stream whole, on its own subject; what was committed is attempt 2's concatenation
    text2, args2, end2 = _in_order(await streams.ended(cfg.names.stream(state.run_id, "main", "solve:t1", 2)))
    assert second.output_ref is not None and end2.finish_reason == "tool_calls"
    message = json.loads(await blobs.get(second.output_ref))
    assert message["content"] == text2 == TEXT and message["tool_calls"][0]["function"]["arguments"] == args2[0]
    assert len(chat_server.requests) == 3
    await assert_refold_identical(event_log, state)


async def test_a_streamed_model_step_publishes_its_tokens(
    executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, cfg: Config,
    chat_server: ChatServer, streams: Streams,
) -> None:
    chat_server.script(streamed("A plan in five small steps.", chunks=8))
    spec = parse_workflow({"name": "streamed-step", "steps": [
        {"kind": "model", "id": "plan", "model": _model(chat_server), "context": [{"id": "task", "text": "plan"}]}]})
    state = await start_and_rest(client, spec)
    assert state.status == "verifying", state.status
    text, _, end = _in_order(await streams.ended(cfg.names.stream(state.run_id, "main", "plan", 1)))
    a = attempt_of(state, "plan", 1)
    assert a.output_ref is not None
    assert text == (await blobs.get(a.output_ref)).decode() == "A plan in five small steps."
    assert end.finish_reason == "stop"
    await assert_refold_identical(event_log, state)


# ---- the command line: tokens as they arrive -------------------------------------------------------------
async def _reel(cfg: Config, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", *args,
        "--nats-url", cfg.nats_url, "--namespace", cfg.names.namespace,
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})


TOKENS_T1 = f'  ┆ solve:t1#1  {TEXT} [lookup] {{"key": "answer"}}'


async def test_reel_run_prints_the_tokens_of_a_streamed_turn(cfg: Config, chat_server: ChatServer,
                                                             tmp_path: Path) -> None:
    chat_server.script(streamed(TEXT, [CALL]), streamed("The answer is 42.", chunks=6))
    wf = tmp_path / "streamed.json"
    wf.write_text(json.dumps(_agent(chat_server)))
    proc = await _reel(cfg, "run", str(wf))
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    lines = text.splitlines()
    assert TOKENS_T1 in lines and "  ┆ solve:t2#1  The answer is 42." in lines, text
    # each on a line of its own, between the commits' progress lines: the turn's intent before, its answer after
    i = lines.index(TOKENS_T1)
    assert "solve:t1#1 dispatched" in lines[i - 1], text
    # the next turn's tokens (core NATS) may come before the commit line of this turn's outcome (JetStream)
    after = next(j for j, ln in enumerate(lines) if "solve:t1#1 succeeded" in ln)
    assert after > i and all("┆ solve:t1" not in ln for ln in lines[i + 1:after]), text


async def test_reel_show_follow_prints_tokens_as_they_arrive(executor: None, client: ReelClient, cfg: Config,
                                                              chat_server: ChatServer) -> None:
    gate = asyncio.Event()
    chat_server.script(streamed(TEXT, [CALL], gate=gate), streamed("The answer is 42.", chunks=6))
    started = await client.start(parse_workflow(_agent(chat_server)))
    assert started.run_id
    proc = await _reel(cfg, "show", started.run_id, "--follow")
    assert proc.stdout is not None
    seen: list[str] = []
    while not any("run created" in line for line in seen):  # it follows the run: its token subscription is up
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line, b"".join(x.encode() for x in seen)
        seen.append(line.decode().rstrip("\n"))
    gate.set()  # only now does the model start streaming
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    lines = seen + out.decode().splitlines()
    assert TOKENS_T1 in lines and "  ┆ solve:t2#1  The answer is 42." in lines, "\n".join(lines)
