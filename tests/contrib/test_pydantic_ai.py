"""Pydantic AI on Reel (reel.contrib.pydantic_ai) with the real ``pydantic-ai-slim`` package against the
loopback chat-completions server: model requests and tool calls as Reel turns and call steps, a
``requires_approval`` tool approved with ``reel approve`` (and one rejected), journal replay after a kill -9,
a rewind at turn 1."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import reel
from reel.contrib import pydantic_ai
from reel.contrib.pydantic_ai import ReelDurability
from reel.shared.core.input import requestfold
from tests.contrib.pyd_app import build, model
from tests.support.chat_server import ChatServer, call, error, reply

pytestmark = pytest.mark.timeout(240)

ROOT = str(Path(__file__).resolve().parents[2])
TASK = "What are 2+3 and 4*5?"


def script(server: ChatServer) -> None:
    """Turn 1: two parallel calls (ids out of order); turn 2: the answer."""
    server.script(reply(tool_calls=[call("mul", {"a": 4, "b": 5}, id="call_b"),
                                    call("add", {"a": 2, "b": 3}, id="call_a")]),
                  reply("2+3=5 and 4*5=20"))


async def cli(client: reel.Client, *args: str) -> tuple[int, str, str]:
    """``reel ARGS`` against the server of ``client`` (a process, as an operator runs it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", *args, "--nats-url", client.url, "--namespace", "reel",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_requests_and_tool_calls_are_reel_turns_and_steps(chat_server: ChatServer, tmp_path: Path) -> None:
    script(chat_server)
    effects = tmp_path / "effects"
    async with reel.local() as client:
        result = await pydantic_ai.run(build(chat_server.url, effects), TASK, client=client, key="k1")
        state = await client.get(pydantic_ai.run_id("k1")).state()
        branch = state.active
        blobs = client._rc.blobs
        assert blobs is not None
        outputs = {s: json.loads(await blobs.get_text(branch.attempts[s][-1].output_ref))  # type: ignore[arg-type]
                   for s in ("calc:t1:c0", "calc:t1:c1")}
        turn1 = json.loads(await blobs.get_text(branch.attempts["calc:t1"][-1].output_ref))  # type: ignore[arg-type]
    assert result.output == "2+3=5 and 4*5=20"
    assert outputs == {"calc:t1:c0": {"result": 5, "kind": "tool_return"},
                       "calc:t1:c1": {"result": 20, "kind": "tool_return"}}
    [sent] = turn1["pydantic_ai"]["request"]  # the messages Pydantic AI sent, as the turn's record
    assert (sent["instructions"], sent["parts"][0]["content"]) == ("Compute with the tools.", TASK)
    parts = turn1["pydantic_ai"]["response"]["parts"]
    assert [(p["tool_name"], p["tool_call_id"]) for p in parts] == [("mul", "call_b"), ("add", "call_a")]
    rec = branch.agents["calc"]
    assert [(c.decl.step_id, c.decl.tool_name, c.decl.call_id) for t in rec.turns for c in t.calls] == [
        ("calc:t1:c0", "add", "call_a"), ("calc:t1:c1", "mul", "call_b")]  # call-id order
    assert sorted(effects.read_text().splitlines()) == ["add 2 3", "mul 4 5"]
    assert len(chat_server.requests) == 2
    assert str(state.status) == "completed"


async def test_killed_mid_tool_resumes_with_each_finished_call_done_once(chat_server: ChatServer,
                                                                         tmp_path: Path) -> None:
    """The process running the agent is SIGKILLed while ``mul`` runs (``add`` recorded); run again, the
    agent is answered turn 1 and ``add`` from the log: the server sees 2 requests, each tool finishes once."""
    script(chat_server)
    store, effects = tmp_path / "js", tmp_path / "effects"
    argv = [sys.executable, "-m", "tests.contrib.pyd_app", chat_server.url, str(store), str(effects)]
    first = await asyncio.create_subprocess_exec(*argv, "block", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE)
    assert first.stdout is not None
    line = await asyncio.wait_for(first.stdout.readline(), 60)  # mul is running, add's outcome is logged
    assert line == b"IN-MUL\n", (await first.communicate())[1].decode()[-3000:]
    first.send_signal(signal.SIGKILL)
    await first.wait()
    assert effects.read_text().splitlines() == ["add 2 3"]
    assert len(chat_server.requests) == 1
    t0 = time.monotonic()
    second = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                  stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(second.communicate(), 150)
    finally:
        if second.returncode is None:  # a resume that hangs fails the test and leaves no process behind
            second.kill()
            await second.wait()
    resumed_s = time.monotonic() - t0
    assert second.returncode == 0, err.decode()[-3000:]
    assert out.decode().strip().splitlines()[-1] == "FINAL 2+3=5 and 4*5=20"
    assert sorted(effects.read_text().splitlines()) == ["add 2 3", "mul 4 5"]
    assert len(chat_server.requests) == 2, [r.body["messages"][-1] for r in chat_server.requests]
    async with reel.local(store_dir=store) as client:  # the log both processes wrote
        state = await client.get(pydantic_ai.run_id("pyd-test")).state()
    attempts = state.active.attempts
    tries = {s: [(a.attempt, str(a.status)) for a in attempts[s]]  # type: ignore[index]
             for s in ("calc:t1", "calc:t1:c0", "calc:t1:c1", "calc:t2")}
    assert tries == {"calc:t1": [(1, "succeeded")], "calc:t1:c0": [(1, "succeeded")],
                     "calc:t1:c1": [(1, "dispatched"), (2, "succeeded")],  # killed in flight (no outcome), re-run
                     "calc:t2": [(1, "succeeded")]}, tries
    print(f"resumed in {resumed_s:.1f} s")


def refund_agent(base_url: str, refunds: list[str]) -> Agent[None, str]:
    agent = Agent(model(base_url), name="support", instructions="Refund when asked.",
                  capabilities=[ReelDurability()])

    @agent.tool_plain(requires_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        refunds.append(order)
        return f"refunded {order}"

    return agent


async def test_requires_approval_tool_waits_for_reel_approve(chat_server: ChatServer) -> None:
    """A ``requires_approval`` tool's call is a Reel input request: the run rests ``awaiting_input`` (the
    agent's run deferred it) until ``reel approve``, here with edited arguments; then the tool runs once,
    with them."""
    refunds: list[str] = []
    chat_server.script(reply(tool_calls=[call("refund", {"order": "A-17"}, id="call_r")]), reply("refunded"))
    async with reel.local() as client:
        task = asyncio.ensure_future(pydantic_ai.run(refund_agent(chat_server.url, refunds), "Refund A-17.",
                                                     client=client, key="k-refund"))
        handle = client.get(pydantic_ai.run_id("k-refund"))
        await handle.wait(("awaiting_input",), timeout_s=60)
        code, out, err = await cli(client, "pending", "--json")
        assert code == 0, err
        [pending] = json.loads(out)
        assert (pending["kind"], pending["tool"], pending["step_id"], refunds) == (
            "approval", "refund", "support:t1:c0", [])
        code, out, err = await cli(client, "approve", handle.run_id, pending["request_id"], "--args",
                                   '{"order": "A-18"}', "--by", "test", "--no-wait")
        assert code == 0, err
        result = await asyncio.wait_for(task, 60)
        state = await handle.state()
    assert result.output == "refunded"
    assert refunds == ["A-18"]
    assert len(chat_server.requests) == 2
    [tool_message] = [m for m in chat_server.requests[1].body["messages"] if m["role"] == "tool"]
    assert tool_message["content"] == "refunded A-18"
    assert [str(a.status) for a in state.active.attempts["support:t1:c0"]] == ["succeeded"]


async def test_rejected_call_is_denied_to_the_agent(chat_server: ChatServer) -> None:
    """``reject`` of a gated call: the tool never runs; the agent continues with the call denied (Pydantic AI's
    ``ToolDenied``), and the model's next request carries the rejection's note."""
    refunds: list[str] = []
    chat_server.script(reply(tool_calls=[call("refund", {"order": "B-2"}, id="call_r")]), reply("not refunded"))
    async with reel.local() as client:
        task = asyncio.ensure_future(pydantic_ai.run(refund_agent(chat_server.url, refunds), "Refund B-2.",
                                                     client=client, key="k-rej"))
        handle = client.get(pydantic_ai.run_id("k-rej"))
        await handle.wait(("awaiting_input",), timeout_s=60)
        [pending] = await handle.pending()
        await handle.reject(pending.request_id, note="no refunds today", by="test")
        result = await asyncio.wait_for(task, 60)
    assert (result.output, refunds) == ("not refunded", [])
    [tool_message] = [m for m in chat_server.requests[1].body["messages"] if m["role"] == "tool"]
    assert "no refunds today" in tool_message["content"], tool_message


async def test_rewind_at_turn_1_reruns_the_agent_on_a_new_branch(chat_server: ChatServer, tmp_path: Path) -> None:
    """After a finished run, a rewind at turn 1 and the same ``run`` call again run the agent from its first
    model request on a new branch; the old branch keeps its turns and calls."""
    script(chat_server)
    effects = tmp_path / "effects"
    agent = build(chat_server.url, effects)
    async with reel.local() as client:
        first = await pydantic_ai.run(agent, TASK, client=client, key="k-rw")
        handle = client.get(pydantic_ai.run_id("k-rw"))
        old = (await handle.state()).active_branch
        rewound = await handle.rewind(at="calc:t1", by="test")
        chat_server.script(reply(tool_calls=[call("add", {"a": 1, "b": 1}, id="call_c")]), reply("1+1=2"))
        second = await pydantic_ai.run(agent, TASK, client=client, key="k-rw")
        state = await handle.state()
    assert (first.output, second.output) == ("2+3=5 and 4*5=20", "1+1=2")
    assert state.active_branch == rewound.branch_id != old

    def calls(branch: str) -> list[tuple[str, str | None]]:
        rec = state.branches[branch].agents["calc"]  # type: ignore[index]
        return [(c.decl.step_id, c.decl.call_id) for t in rec.turns for c in t.calls]

    assert calls(old) == [("calc:t1:c0", "call_a"), ("calc:t1:c1", "call_b")]
    assert calls(rewound.branch_id) == [("calc:t1:c0", "call_c")]
    assert sorted(effects.read_text().splitlines()) == ["add 1 1", "add 2 3", "mul 4 5"]
    assert len(chat_server.requests) == 4


async def test_an_agent_without_the_capability_is_refused(chat_server: ChatServer) -> None:
    async with reel.local() as client:
        with pytest.raises(TypeError, match="ReelDurability"):
            await pydantic_ai.run(Agent(model(chat_server.url), name="plain"), "Hi.", client=client)


async def test_rewind_at_a_later_turn_replays_the_earlier_ones(chat_server: ChatServer, tmp_path: Path) -> None:
    """A rewind at turn 2 (the answer): run again, turn 1 and its calls are answered from the new branch's
    inherited log — one new model request, no tool runs again."""
    script(chat_server)
    effects = tmp_path / "effects"
    agent = build(chat_server.url, effects)
    async with reel.local() as client:
        await pydantic_ai.run(agent, TASK, client=client, key="k-rw2")
        await client.get(pydantic_ai.run_id("k-rw2")).rewind(at="calc:t2", by="test")
        chat_server.script(reply("the same, rewritten"))
        second = await pydantic_ai.run(agent, TASK, client=client, key="k-rw2")
    assert second.output == "the same, rewritten"
    assert len(chat_server.requests) == 3
    assert sorted(effects.read_text().splitlines()) == ["add 2 3", "mul 4 5"]


async def test_a_model_error_is_the_agent_s_error_and_the_turn_s_failure(chat_server: ChatServer) -> None:
    """A 400 from the server: ``run`` raises Pydantic AI's own exception and the Reel turn is recorded failed."""
    client_ = AsyncOpenAI(base_url=chat_server.url, api_key="loopback", max_retries=0)
    agent = Agent(OpenAIChatModel("loopback-1", provider=OpenAIProvider(openai_client=client_)), name="solo",
                  capabilities=[ReelDurability()])
    chat_server.script(error(400, "bad request, scripted"))
    async with reel.local() as client:
        with pytest.raises(ModelHTTPError, match="bad request, scripted"):
            await pydantic_ai.run(agent, "Hi.", client=client, key="k-err")
        handle = client.get(pydantic_ai.run_id("k-err"))
        state = await handle.wait(("completed", "failed"), timeout_s=60)
    [attempt] = state.active.attempts["solo:t1"]  # type: ignore[index]
    assert (attempt.status, attempt.error_kind) == ("failed", "model_error")


async def test_killed_in_an_approved_call_resumes_without_asking_again(chat_server: ChatServer,
                                                                        tmp_path: Path) -> None:
    """``reel approve`` of the gated call, then the process is SIGKILLed while the approved tool runs; run
    again, the approval is in the log (no new request to approve), the tool finishes once, one more model
    request."""
    chat_server.script(reply(tool_calls=[call("refund", {"order": "A-17"}, id="call_r")]), reply("refunded"))
    store, effects = tmp_path / "js", tmp_path / "effects"
    argv = [sys.executable, "-m", "tests.contrib.pyd_app", chat_server.url, str(store), str(effects), "refund"]
    first = await asyncio.create_subprocess_exec(*argv, "block", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE)
    assert first.stdout is not None
    try:
        line = (await asyncio.wait_for(first.stdout.readline(), 60)).decode()
        assert line.startswith("AWAITING "), (await first.communicate())[1].decode()[-3000:]
        url = line.split()[1]

        async def reel_cli(*args: str) -> str:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "reel.services.cli", *args, "--nats-url", url, "--namespace", "reel",
                cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, err.decode()
            return out.decode()

        [pending] = json.loads(await reel_cli("pending", "--json"))
        await reel_cli("approve", pending["run_id"], pending["request_id"], "--by", "test", "--no-wait")
        assert await asyncio.wait_for(first.stdout.readline(), 60) == b"IN-REFUND\n"
    finally:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    assert not effects.exists() and len(chat_server.requests) == 1
    second = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                  stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(second.communicate(), 150)
    finally:
        if second.returncode is None:
            second.kill()
            await second.wait()
    assert second.returncode == 0, err.decode()[-3000:]
    assert out.decode().strip().splitlines()[-1] == "FINAL refunded"
    assert effects.read_text().splitlines() == ["refund A-17"]
    assert len(chat_server.requests) == 2
    async with reel.local(store_dir=store) as client:
        state = await client.get(pydantic_ai.run_id("pyd-refund")).state()
    branch = state.active
    assert [(a.attempt, str(a.status)) for a in branch.attempts["support:t1:c0"]] == [  # type: ignore[index]
        (1, "dispatched"), (2, "succeeded")]
    [request] = requestfold.requests_of(branch).values()  # asked once, approved once
    assert request.response is not None and request.response.decision == "approve"
