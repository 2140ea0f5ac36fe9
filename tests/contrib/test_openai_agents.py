"""The OpenAI Agents SDK on Reel (reel.contrib.openai_agents) with the real ``openai-agents`` package against
the loopback chat-completions server: parallel function tools, a handoff, journal replay after a kill, a
``needs_approval`` tool approved through Reel, a rewind at turn 1."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from agents import Agent, OpenAIChatCompletionsModel, OpenAIProvider, RunConfig, function_tool, set_tracing_disabled
from openai import AsyncOpenAI, BadRequestError
from pydantic import BaseModel

import reel
from reel.contrib import openai_agents
from tests.contrib.oa_app import build
from tests.support.chat_server import ChatServer, call, error, reply, streamed

pytestmark = pytest.mark.timeout(240)

ROOT = str(Path(__file__).resolve().parents[2])


def script(server: ChatServer) -> None:
    """Turn 1: two parallel calls (ids out of order); turn 2: the handoff; turn 3: the writer's answer."""
    server.script(reply(tool_calls=[call("mul", {"a": 4, "b": 5}, id="call_b"),
                                    call("add", {"a": 2, "b": 3}, id="call_a")]),
                  reply(tool_calls=[call("transfer_to_writer", {}, id="call_h")]),
                  reply("2+3=5 and 4*5=20"))


async def test_parallel_tools_and_handoff_are_reel_steps(chat_server: ChatServer, tmp_path: Path) -> None:
    set_tracing_disabled(True)
    script(chat_server)
    effects = tmp_path / "effects"
    agent = build(chat_server.url, effects)
    async with reel.local() as client:
        result = await openai_agents.run(agent, "What are 2+3 and 4*5?", client=client, key="k1")
        assert (result.final_output, result.last_agent.name) == ("2+3=5 and 4*5=20", "writer")
        [run_id] = await client.runs()
        state = await client.get(run_id).state()
        branch = state.active
        blobs = client._rc.blobs
        assert blobs is not None
        outputs = {s: await blobs.get_text(branch.attempts[s][-1].output_ref)  # type: ignore[arg-type]
                   for s in ("triage:t1:c0", "triage:t1:c1", "triage:t2:c0")}
        turn1 = json.loads(await blobs.get_text(branch.attempts["triage:t1"][-1].output_ref))  # type: ignore[arg-type]
    assert outputs == {"triage:t1:c0": "5", "triage:t1:c1": "20", "triage:t2:c0": '{"assistant": "writer"}'}
    request = turn1["openai_agents"]["request"]  # the SDK's own request, as the turn's record
    assert (request["system_instructions"], request["tools"], request["handoffs"]) == (
        "Compute, then hand off to the writer.", ["add", "mul"], ["transfer_to_writer"])
    assert request["input"] == [{"content": "What are 2+3 and 4*5?", "role": "user"}]
    rec = branch.agents["triage"]
    calls = [(c.decl.step_id, c.decl.tool_name, c.decl.call_id) for t in rec.turns for c in t.calls]
    assert calls == [("triage:t1:c0", "add", "call_a"), ("triage:t1:c1", "mul", "call_b"),
                     ("triage:t2:c0", "transfer_to_writer", "call_h")]
    assert sorted(effects.read_text().splitlines()) == ["add 2 3", "mul 4 5"]
    assert len(chat_server.requests) == 3
    assert str(state.status) == "completed"


async def test_killed_mid_tool_resumes_with_each_finished_call_done_once(chat_server: ChatServer,
                                                                         tmp_path: Path) -> None:
    """The process running the SDK agent is SIGKILLed while ``mul`` runs (``add`` recorded); run again, the
    SDK is answered turn 1 and ``add`` from the log: the server sees 3 requests, each tool finishes once."""
    script(chat_server)
    store, effects = tmp_path / "js", tmp_path / "effects"
    argv = [sys.executable, "-m", "tests.contrib.oa_app", chat_server.url, str(store), str(effects)]
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    first = await asyncio.create_subprocess_exec(*argv, "block", env=env, cwd=ROOT,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert first.stdout is not None
    line = await asyncio.wait_for(first.stdout.readline(), 60)  # mul is running, add's outcome is logged
    assert line == b"IN-MUL\n", (await first.communicate())[1].decode()[-3000:]
    first.send_signal(signal.SIGKILL)
    await first.wait()
    assert effects.read_text().splitlines() == ["add 2 3"]
    assert len(chat_server.requests) == 1
    t0 = time.monotonic()
    second = await asyncio.create_subprocess_exec(*argv, env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                  stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(second.communicate(), 150)
    finally:
        if second.returncode is None:  # a resume that hangs fails the test and leaves no process behind
            second.kill()
            await second.wait()
    resumed_s = time.monotonic() - t0
    assert second.returncode == 0, err.decode()[-3000:]
    assert out.decode().strip().splitlines()[-1] == "FINAL writer: 2+3=5 and 4*5=20"
    assert sorted(effects.read_text().splitlines()) == ["add 2 3", "mul 4 5"]
    assert len(chat_server.requests) == 3, [r.body["messages"][-1] for r in chat_server.requests]
    async with reel.local(store_dir=store) as client:  # the log both processes wrote
        state = await client.get(openai_agents.run_id("oa-test")).state()
    attempts = state.active.attempts
    tries = {s: [(a.attempt, str(a.status)) for a in attempts[s]]  # type: ignore[index]
             for s in ("triage:t1", "triage:t1:c0", "triage:t1:c1", "triage:t2", "triage:t3")}
    assert tries == {"triage:t1": [(1, "succeeded")], "triage:t1:c0": [(1, "succeeded")],
                     "triage:t1:c1": [(1, "dispatched"), (2, "succeeded")],  # killed in flight (no outcome), re-run
                     "triage:t2": [(1, "succeeded")], "triage:t3": [(1, "succeeded")]}, tries
    print(f"resumed in {resumed_s:.1f} s")


class Refund(BaseModel):
    """The writer's structured answer (the SDK's output_type)."""

    order: str
    approved: bool


async def test_needs_approval_tool_waits_for_reel_approve(chat_server: ChatServer, tmp_path: Path) -> None:
    """A ``needs_approval`` tool's call is a Reel input request: the run rests ``awaiting_input`` until
    ``approve``; then the tool runs once and the agent's output type is the SDK's final output."""
    set_tracing_disabled(True)
    refunds: list[str] = []

    @function_tool(needs_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        refunds.append(order)
        return f"refunded {order}"

    model = OpenAIChatCompletionsModel(model="loopback-1",
                                       openai_client=AsyncOpenAI(base_url=chat_server.url, api_key="loopback"))
    agent = Agent(name="support", instructions="Refund when asked.", model=model, tools=[refund],
                  output_type=Refund)
    chat_server.script(reply(tool_calls=[call("refund", {"order": "A-17"}, id="call_r")]),
                       reply('{"order": "A-17", "approved": true}'))
    async with reel.local() as client:
        task = asyncio.ensure_future(openai_agents.run(agent, "Refund A-17.", client=client, key="k-refund"))
        handle = client.get(openai_agents.run_id("k-refund"))
        await handle.wait(("awaiting_input",), timeout_s=60)
        [pending] = await handle.pending()
        assert (pending.kind, pending.tool, pending.call_id, refunds) == ("approval", "refund", "call_r", [])
        await handle.approve(pending.request_id, by="test")
        result = await asyncio.wait_for(task, 60)
    assert result.final_output == Refund(order="A-17", approved=True)
    assert refunds == ["A-17"]
    assert len(chat_server.requests) == 2


async def test_rewind_at_turn_1_reruns_the_sdk_on_a_new_branch(chat_server: ChatServer, tmp_path: Path) -> None:
    """After a finished run, a rewind at turn 1 and the same ``run`` call again re-run the SDK from its first
    model call on a new branch; the old branch keeps its turns and calls."""
    set_tracing_disabled(True)
    script(chat_server)
    effects = tmp_path / "effects"
    agent = build(chat_server.url, effects)
    async with reel.local() as client:
        first = await openai_agents.run(agent, "What are 2+3 and 4*5?", client=client, key="k-rw")
        [run_id] = await client.runs()
        handle = client.get(run_id)
        old = (await handle.state()).active_branch
        rewound = await handle.rewind(at="triage:t1", by="test")
        chat_server.script(reply(tool_calls=[call("add", {"a": 1, "b": 1}, id="call_c")]),
                           reply(tool_calls=[call("transfer_to_writer", {}, id="call_h2")]),
                           reply("1+1=2"))
        second = await openai_agents.run(agent, "What are 2+3 and 4*5?", client=client, key="k-rw")
        state = await handle.state()
    assert (first.final_output, second.final_output) == ("2+3=5 and 4*5=20", "1+1=2")
    assert state.active_branch == rewound.branch_id != old
    def calls(branch: str) -> list[tuple[str, str | None]]:
        rec = state.branches[branch].agents["triage"]  # type: ignore[index]
        return [(c.decl.step_id, c.decl.call_id) for t in rec.turns for c in t.calls]
    assert calls(old) == [("triage:t1:c0", "call_a"), ("triage:t1:c1", "call_b"), ("triage:t2:c0", "call_h")]
    assert calls(rewound.branch_id) == [("triage:t1:c0", "call_c"), ("triage:t2:c0", "call_h2")]
    assert sorted(effects.read_text().splitlines()) == ["add 1 1", "add 2 3", "mul 4 5"]
    assert len(chat_server.requests) == 6


async def test_rejected_call_and_a_model_named_by_string(chat_server: ChatServer) -> None:
    """An agent whose ``model`` is a name (resolved by the run config's provider: chat completions on the
    loopback server); ``reject`` of its ``needs_approval`` call: the tool never runs, the SDK's tool output is
    Reel's recorded refusal, and the model's next request carries it."""
    set_tracing_disabled(True)
    refunds: list[str] = []

    @function_tool(needs_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        refunds.append(order)
        return f"refunded {order}"

    agent = Agent(name="support", instructions="Refund when asked.", model="loopback-1", tools=[refund])
    config = RunConfig(model_provider=OpenAIProvider(
        openai_client=AsyncOpenAI(base_url=chat_server.url, api_key="loopback"), use_responses=False))
    chat_server.script(reply(tool_calls=[call("refund", {"order": "B-2"}, id="call_r")]), reply("not refunded"))
    async with reel.local() as client:
        task = asyncio.ensure_future(openai_agents.run(agent, "Refund B-2.", client=client, key="k-rej",
                                                       run_config=config))
        handle = client.get(openai_agents.run_id("k-rej"))
        await handle.wait(("awaiting_input",), timeout_s=60)
        [pending] = await handle.pending()
        await handle.reject(pending.request_id, note="no refunds today", by="test")
        result = await asyncio.wait_for(task, 60)
    assert (result.final_output, refunds) == ("not refunded", [])
    [tool_message] = [m for m in chat_server.requests[1].body["messages"] if m["role"] == "tool"]
    assert "no refunds today" in tool_message["content"], tool_message
    assert chat_server.requests[0].body["model"] == "loopback-1"


async def test_a_model_error_is_the_sdk_s_error_and_the_turn_s_failure(chat_server: ChatServer) -> None:
    """A 400 from the server: ``run`` raises the SDK's own exception and the Reel turn is recorded failed."""
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="loopback-1",
                                       openai_client=AsyncOpenAI(base_url=chat_server.url, api_key="loopback",
                                                                 max_retries=0))
    chat_server.script(error(400, "bad request, scripted"))
    async with reel.local() as client:
        with pytest.raises(BadRequestError, match="bad request, scripted"):
            await openai_agents.run(Agent(name="solo", instructions="Answer.", model=model), "Hi.", client=client,
                                    key="k-err")
        state = await client.get(openai_agents.run_id("k-err")).wait(("completed",), timeout_s=60)
    [attempt] = state.active.attempts["solo:t1"]  # type: ignore[index]
    assert (attempt.status, attempt.error_kind) == ("failed", "model_error")


async def test_rewind_at_a_later_turn_replays_the_earlier_ones(chat_server: ChatServer, tmp_path: Path) -> None:
    """A rewind at turn 3 (the writer's answer): run again, turns 1–2 and their calls are answered from the
    new branch's inherited log — one new model request, no tool runs again."""
    set_tracing_disabled(True)
    script(chat_server)
    effects = tmp_path / "effects"
    agent = build(chat_server.url, effects)
    async with reel.local() as client:
        await openai_agents.run(agent, "What are 2+3 and 4*5?", client=client, key="k-rw3")
        await client.get(openai_agents.run_id("k-rw3")).rewind(at="triage:t3", by="test")
        chat_server.script(reply("the same, rewritten"))
        second = await openai_agents.run(agent, "What are 2+3 and 4*5?", client=client, key="k-rw3")
    assert (second.final_output, second.last_agent.name) == ("the same, rewritten", "writer")
    assert len(chat_server.requests) == 4
    assert sorted(effects.read_text().splitlines()) == ["add 2 3", "mul 4 5"]


async def test_a_streamed_run_publishes_its_deltas_on_reels_stream_subjects(chat_server: ChatServer,
                                                                           tmp_path: Path) -> None:
    """``stream=True``: each SDK model call is streamed; its text and tool-call deltas arrive on the run's
    stream subjects while the log keeps the whole response and the SDK gets the same result."""
    set_tracing_disabled(True)
    chat_server.script(streamed(tool_calls=[call("add", {"a": 2, "b": 3}, id="call_a")], chunks=8),
                       streamed("2+3 makes five, as computed", chunks=9))

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = OpenAIChatCompletionsModel(model="loopback-1",
                                       openai_client=AsyncOpenAI(base_url=chat_server.url, api_key="unused"))
    agent = Agent(name="adder", instructions="Add.", tools=[add], model=model)
    async with reel.local() as client:
        run_id = openai_agents.run_id("streamed-1")
        async with client.get(run_id).stream() as tokens:
            result = await openai_agents.run(agent, "What is 2+3?", client=client, key="streamed-1", stream=True)
            got: list[reel.Token] = []
            async with asyncio.timeout(30):  # the fragments were published while the run went on
                async for token in tokens:
                    got.append(token)
                    if token.done and token.step_id == "adder:t2":
                        break
        state = await client.get(run_id).state()
    assert result.final_output == "2+3 makes five, as computed"
    text = "".join(t.text for t in got if t.step_id == "adder:t2")
    assert text == "2+3 makes five, as computed"
    args = "".join(a for t in got if t.step_id == "adder:t1" for _, a in t.tool_calls)
    assert json.loads(args) == {"a": 2, "b": 3}
    assert [t.step_id for t in got if t.done] == ["adder:t1", "adder:t2"]
    assert all(s.body.get("stream") is True for s in chat_server.requests), "each model call was streamed"
    assert str(state.status) == "completed"
