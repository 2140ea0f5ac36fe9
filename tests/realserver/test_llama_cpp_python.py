"""Agent turns and model steps on llama-cpp-python's real server (SmolLM2-135M, ``chatml-function-calling``), through
the real executor, the real ``openai`` client and a byte-recording loopback proxy (tests/realserver/proxy.py).

Each test asserts what the log records — the prompt blob is the exact body that reached the server, the
attempts' outcomes and errors, the tokens the server reported — and what the server answered on the wire;
never what the tiny model chooses to say. Where the model could choose, the request forces the server's hand
(a named ``tool_choice`` makes it call that tool, whatever the model would say).

What the suite measures here is the llama-cpp-python row of docs/models.md's server table.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.msg import Msg

from reel.shared.core.run.eventfields import BlobRef, usage_source
from reel.shared.core.run.state import AttemptState, RunState
from reel.shared.core.wire.livemessages import StreamChunk, decode_chunk
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.integration.agent_support import LOOKUP, start_and_rest
from tests.realserver.conftest import Llama, start_llama
from tests.realserver.proxy import RecordingProxy, recording_proxy

pytestmark = pytest.mark.realserver

FORCE_LOOKUP = {"type": "function", "function": {"name": "lookup"}}
TASK = "Look up the value of the key `answer` with the lookup tool, then say it."


@pytest.fixture
async def proxy(llama: Llama) -> AsyncIterator[RecordingProxy]:
    async with recording_proxy(llama.host, llama.port) as p:
        yield p


def _model(url: str, **model: Any) -> dict[str, Any]:
    return {"adapter": "openai", "base_url": url, "model": "smollm2-135m", "timeout_s": 120, **model}


def agent(url: str, *, max_turns: int = 2, max_attempts: int = 1, **model: Any) -> WorkflowSpec:
    """One agent step with the ``lookup`` tool on the server behind ``url``."""
    return parse_workflow({"name": "realserver-agent", "steps": [{
        "kind": "agent", "id": "solve", "max_turns": max_turns, "max_attempts": max_attempts,
        "instructions": "You are a careful agent. Use the tools, then answer in one sentence.",
        "context": [{"id": "task", "kind": "task", "text": TASK}],
        "model": _model(url, **model), "tools": [LOOKUP]}]})


def model_step(url: str, *, max_attempts: int = 1, on_truncated: str = "fail", **model: Any) -> WorkflowSpec:
    """One ``kind: model`` step (no tools) on the server behind ``url``."""
    return parse_workflow({"name": "realserver-model", "steps": [{
        "kind": "model", "id": "say", "max_attempts": max_attempts, "on_truncated": on_truncated,
        "model": _model(url, **model),
        "context": [{"id": "task", "kind": "task", "text": "Write a long story about a lighthouse keeper."}]}]})


def model_attempts(state: RunState) -> list[AttemptState]:
    """The model calls of the run, in dispatch order (an agent's turns; a model step's attempts)."""
    branch = state.active
    calls = [a for sid, atts in branch.attempts.items() if ":c" not in sid for a in atts if sid != "solve"]
    return sorted(calls, key=lambda a: a.dispatched_lsn)


async def prompts(blobs: JetStreamBlobStore, attempts: list[AttemptState]) -> list[bytes]:
    out = []
    for a in attempts:
        assert a.prompt_ref is not None, f"{a.step_id}#{a.attempt} has no prompt blob"
        out.append(await blobs.get(a.prompt_ref))
    return out


async def step_prompt_sent(blobs: JetStreamBlobStore, a: AttemptState, body: bytes) -> bool:
    """A ``kind: model`` attempt's prompt blob is the request ``body`` it sent (JSON), as an agent turn's is."""
    assert a.prompt_ref is not None
    return bool(json.loads(await blobs.get(a.prompt_ref)) == json.loads(body))


def wire_answer(response: bytes) -> dict[str, Any]:
    """The JSON body of a (non-streamed) response on a connection."""
    return dict(json.loads(response.split(b"\r\n\r\n", 1)[1]))


def source(a: AttemptState) -> str:
    return usage_source(a.usage)


def finish(a: AttemptState) -> str | None:
    """The finish reason the attempt recorded; None when it has none (no answer came)."""
    return None if isinstance(a.finish_reason, msgspec.UnsetType) else a.finish_reason


def status_of(response: bytes) -> int:
    """The HTTP status of the (first) response on a connection."""
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else 0


def post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    """POST ``body`` to the server's chat completions (blocking; run it in a thread)."""
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# ---- a turn after a tool result ------------------------------------------------------------------------------
async def test_a_turn_after_a_tool_result_is_answered_and_its_prompt_blob_is_the_bytes_sent(
        executor: None, client: ReelClient, blobs: JetStreamBlobStore, proxy: RecordingProxy) -> None:
    spec = agent(proxy.url, profile="llama-cpp-python", params={"temperature": 0, "max_tokens": 48,
                                                                 "tool_choice": FORCE_LOOKUP})
    state = await start_and_rest(client, spec, timeout_s=240)
    turns = model_attempts(state)
    assert [a.step_id for a in turns] == ["solve:t1", "solve:t2"], turns
    assert turns[0].status == "succeeded" and turns[1].error_kind != "server_error", turns
    call = state.branches["main"].attempts["solve:t1:c0"][0]  # its result (or error observation) is in turn 2
    assert call.status in ("succeeded", "failed"), call
    sent = proxy.chat()
    assert [body for body, _ in sent] == await prompts(blobs, turns)  # the prompt blob is exactly what was sent
    assert [status_of(resp) for _, resp in sent] == [200, 200]
    second = json.loads(sent[1][0])
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assistant = second["messages"][2]
    assert assistant["content"] == "" and assistant["tool_calls"][0]["function"]["name"] == "lookup"
    assert second["messages"][3]["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert (second["tool_choice"], second["parallel_tool_calls"]) == (FORCE_LOOKUP, False)
    for a, (_, resp) in zip(turns, sent, strict=True):  # the finish reason and tokens are the server's own
        answer = wire_answer(resp)
        usage, reason = answer["usage"], answer["choices"][0]["finish_reason"]
        assert (a.usage.input_tokens, a.usage.output_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
        assert (finish(a), source(a)) == (reason, "reported"), a
        # a call the server cut (length) is no answer: the turn ends truncated (on_truncated: fail)
        assert (a.status, a.error_kind) == (("failed", "truncated") if reason == "length" else ("succeeded", None))
    assert turns[0].finish_reason == "tool_calls"  # the named tool_choice: the server's grammar made the call


async def test_null_content_beside_tool_calls_is_refused_with_500_and_so_is_none(
        executor: None, client: ReelClient, blobs: JetStreamBlobStore, proxy: RecordingProxy, llama: Llama) -> None:
    spec = agent(proxy.url, compat={"tool_call_content": "null"},
                 params={"temperature": 0, "max_tokens": 32, "tool_choice": FORCE_LOOKUP})
    state = await start_and_rest(client, spec, timeout_s=240)
    t1, t2 = model_attempts(state)
    assert (t1.status, t2.status, t2.error_kind) == ("succeeded", "failed", "server_error"), (t1, t2)
    assert t2.error_message is not None and "answered 500" in t2.error_message
    sent = proxy.chat()
    assert [status_of(resp) for _, resp in sent] == [200, 500]
    wire_body = sent[1][1].split(b"\r\n\r\n", 1)[1]
    assert b"Input should be a valid string" in wire_body  # the server's own reason, on the wire ...
    assert isinstance(t2.error_ref, BlobRef) and await blobs.get(t2.error_ref) == wire_body  # ... kept whole
    assert (finish(t2), source(t2), t2.usage.input_tokens, t2.usage.output_tokens) == (None, "none", 0, 0)
    body = json.loads(sent[1][0])
    assert body["messages"][2]["content"] is None and json.loads(await blobs.get(t2.prompt_ref)) == body  # type: ignore[arg-type]
    # the same turn, re-posted: without the key the server's template fails; with "" it is answered
    del body["messages"][2]["content"]
    omitted = await asyncio.to_thread(post, llama.url, body)
    body["messages"][2]["content"] = ""
    empty = await asyncio.to_thread(post, llama.url, body)
    assert (omitted[0], empty[0]) == (500, 200), (omitted, empty)


# ---- streaming ----------------------------------------------------------------------------------------------
class FirstChunks:
    """Every stream message of the namespace, and a rendezvous on the first one."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, StreamChunk]] = []
        self.first = asyncio.Event()

    async def on_msg(self, msg: Msg) -> None:
        self.chunks.append((msg.subject, decode_chunk(msg.data)))
        self.first.set()


@pytest.fixture
async def streams(infra: Infra, cfg: Config) -> AsyncIterator[FirstChunks]:
    s = FirstChunks()
    sub = await infra.nc.subscribe(f"{cfg.names.namespace}.stream.>", cb=s.on_msg)
    try:
        yield s
    finally:
        await sub.unsubscribe()


async def test_the_profile_sends_tool_turns_unstreamed_and_a_streamed_tool_turn_breaks_after_its_200(
        executor: None, client: ReelClient, blobs: JetStreamBlobStore, proxy: RecordingProxy) -> None:
    params = {"temperature": 0, "max_tokens": 16}
    profiled = await start_and_rest(client, agent(proxy.url, max_turns=1, stream=True, profile="llama-cpp-python",
                                                  params=params), timeout_s=240)
    (turn,) = model_attempts(profiled)
    assert turn.status == "succeeded", turn
    body = json.loads(await blobs.get(turn.prompt_ref))  # type: ignore[arg-type]
    assert "stream" not in body and body["tool_choice"] == "auto"
    # the same agent without the profile asks for a stream: the server answers 200, then cannot stream a tool
    # choice ("Automatic streaming tool choice is not supported") and sends no event
    plain = await start_and_rest(client, agent(proxy.url, max_turns=1, stream=True, params=params), timeout_s=240)
    (broken,) = model_attempts(plain)
    assert (broken.status, broken.error_kind) == ("failed", "stream_broken"), broken
    assert (source(broken), broken.usage.input_tokens, broken.usage.output_tokens) == ("none", 0, 0)
    assert turn.finish_reason in ("tool_calls", "stop", "length") and source(turn) == "reported"
    sent = proxy.chat()
    assert [status_of(resp) for _, resp in sent] == [200, 200]
    assert json.loads(sent[1][0])["stream"] is True and b"data:" not in sent[1][1]


async def test_a_streamed_answer_reaches_subscribers_and_the_server_sends_no_usage_in_the_stream(
        executor: None, client: ReelClient, blobs: JetStreamBlobStore, proxy: RecordingProxy,
        streams: FirstChunks) -> None:
    state = await start_and_rest(client, model_step(proxy.url, stream=True, on_truncated="continue",
                                                    params={"temperature": 0, "max_tokens": 12}))
    (a,) = model_attempts(state)
    assert (a.status, a.finish_reason, a.truncated) == ("succeeded", "length", True), a  # taken as cut
    ((body, resp),) = proxy.chat()
    assert await step_prompt_sent(blobs, a, body)
    assert json.loads(body)["stream_options"] == {"include_usage": True}
    events = [json.loads(line[6:]) for line in resp.split(b"\n") if line.startswith(b"data: {")]
    assert events and not [e for e in events if e.get("usage")]  # asked for, never sent: usage is Reel's count
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert (await blobs.get(a.output_ref)).decode() == text  # type: ignore[arg-type]  # a model step's output: the text
    assert "".join(c.content for _, c in streams.chunks) == text and streams.chunks[-1][1].done
    assert source(a) == "estimated" and a.usage.input_tokens > 0  # counted by Reel: the server reported none


# ---- a max_tokens cut ---------------------------------------------------------------------------------------
async def test_a_max_tokens_cut_ends_the_attempt_truncated_with_the_cut_answer_kept(
        executor: None, client: ReelClient, blobs: JetStreamBlobStore, proxy: RecordingProxy) -> None:
    state = await start_and_rest(client, model_step(proxy.url, params={"temperature": 0, "max_tokens": 4}))
    (a,) = model_attempts(state)
    ((body, resp),) = proxy.chat()
    answer = wire_answer(resp)
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 4
    assert await step_prompt_sent(blobs, a, body) and json.loads(body)["max_tokens"] == 4
    assert (a.status, a.error_kind, a.retryable, a.finish_reason) == ("failed", "truncated", False, "length"), a
    assert (a.usage.input_tokens, a.usage.output_tokens, source(a)) == (answer["usage"]["prompt_tokens"], 4,
                                                                        "reported")
    assert isinstance(a.error_ref, BlobRef)  # the cut answer, kept
    assert answer["choices"][0]["message"]["content"] in (await blobs.get(a.error_ref)).decode()


# ---- the server killed mid-answer ---------------------------------------------------------------------------
async def test_the_server_killed_mid_answer_is_a_broken_stream_then_an_unreachable_server(
        executor: None, client: ReelClient, blobs: JetStreamBlobStore, llama_venv: Path, streams: FirstChunks) -> None:
    async with start_llama(llama_venv) as own, recording_proxy(own.host, own.port) as proxy:
        started = await client.start(model_step(proxy.url, max_attempts=2, stream=True,
                                                params={"temperature": 0, "max_tokens": 400}))
        assert started.ok and started.run_id
        await asyncio.wait_for(streams.first.wait(), 120)  # it is answering
        own.kill()
        killed_at = time.monotonic()
        state = await client.wait_for(started.run_id, ("verifying", "completed", "cancelled"), timeout_s=120)
    a1, a2 = model_attempts(state)
    assert (a1.status, a1.error_kind, a2.status, a2.error_kind) == ("failed", "stream_broken", "failed",
                                                                    "connection"), (a1, a2)
    assert time.monotonic() - killed_at < 60
    assert (source(a2), a2.usage.input_tokens, a2.usage.output_tokens) == ("none", 0, 0)  # never reached a server
    assert finish(a1) is None and finish(a2) is None  # the answer never finished
    ((body, resp), *rest) = proxy.chat()
    assert await step_prompt_sent(blobs, a1, body) and b"data: {" in resp and b"[DONE]" not in resp
    assert not rest  # attempt 2 never reached a server: nothing was received for it
    assert await step_prompt_sent(blobs, a2, body)  # what attempt 2 would have sent
