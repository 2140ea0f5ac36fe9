"""An agent's ``mcp:`` tools end to end (``reel.local()``: a real nats-server and every service in this process):
a real MCP server from PyPI (``mcp-server-time``) over stdio, and a server of the test's own (the SDK's
``MCPServer``) over streamable HTTP; the scripted model calls their tools."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

import reel
from reel.events import AttemptFailed, AttemptSucceeded, StepsDeclared
from reel.shared.core.run.ids import run_id_for_key
from tests.support import mcp_server

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
async def local() -> AsyncIterator[reel.Client]:
    async with reel.local() as client:
        yield client


async def _facts(handle: reel.RunHandle) -> tuple[dict[str, str], dict[str, AttemptFailed], dict[str, bool]]:
    """Each call step's output text, failure, and declared retry_safe."""
    rc = handle._rc
    out: dict[str, str] = {}
    failed: dict[str, AttemptFailed] = {}
    safe: dict[str, bool] = {}
    async for c in handle.events(follow=False):
        for e in c.events:
            if isinstance(e, AttemptSucceeded) and ":c" in e.step_id and e.output_ref is not None:
                out[e.step_id] = (await rc.blobs.get(e.output_ref)).decode()
            elif isinstance(e, AttemptFailed):
                failed[e.step_id] = e
            elif isinstance(e, StepsDeclared):
                safe.update({d.step_id: d.retry_safe for d in e.steps if ":c" in d.step_id})
    return out, failed, safe


async def _offered(handle: reel.RunHandle, step: str) -> list[dict[str, Any]]:
    """The tool schemas of the recorded request of turn ``step``."""
    rc = handle._rc
    state = await handle.state()
    attempt = next(a for a in state.branches["main"].attempts[step] if a.prompt_ref is not None)
    assert attempt.prompt_ref is not None
    return list(json.loads(await rc.blobs.get(attempt.prompt_ref))["tools"])


async def test_a_pypi_server_over_stdio(local: reel.Client) -> None:
    time_tools = reel.mcp_tools(name="time", command=[sys.executable, "-m", "mcp_server_time",
                                                      "--local-timezone", "UTC"], exclude=["convert_*"])
    agent = reel.Agent(name="clock", instructions="Tell the time.", tools=[time_tools], model=reel.ScriptedModel(
        turns=[{"tool_calls": [{"name": "time__get_current_time", "arguments": {"timezone": "Europe/Paris"}},
                               {"name": "time__get_current_time", "arguments": {"timezone": "Nowhere/Atlantis"}}]},
               {"text": "done"}]))
    handle = await local.start(agent, input="What time is it in Paris?")
    result = await handle.result(timeout_s=90)
    assert (result.status, result.output) == ("completed", "done")
    out, failed, safe = await _facts(handle)
    assert json.loads(out["clock:t1:c0"])["timezone"] == "Europe/Paris"  # the server's answer, recorded as is
    bad = failed["clock:t1:c1"]  # an isError result: an error observation the next turn sees
    assert bad.error_kind == "tool_error" and "Nowhere/Atlantis" in bad.message
    assert safe == {"clock:t1:c0": True, "clock:t1:c1": True}  # its annotations say read-only
    offered = await _offered(handle, "clock:t1")
    names = [t["function"]["name"] for t in offered]
    assert names == ["time__get_current_time"]  # convert_time excluded
    params = offered[0]["function"]["parameters"]
    assert "timezone" in params["properties"]


class _Uvicorn(uvicorn.Server):
    """uvicorn's server with an event set once it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@pytest.fixture
async def http_url() -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = mcp_server.server().streamable_http_app()
    server = _Uvicorn(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await server.ready.wait()
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    await task


async def test_a_server_of_our_own_over_streamable_http(local: reel.Client, http_url: str) -> None:
    tools = reel.mcp_tools(name="calc", url=http_url, retry_safe={"explode": True}, include=["add", "explode"])
    agent = reel.Agent(name="calc", instructions="Compute.", tools=[tools], model=reel.ScriptedModel(
        turns=[{"tool_calls": [{"name": "calc__add", "arguments": {"a": 2, "b": 3}},
                               {"name": "calc__explode", "arguments": {"why": "on purpose"}}]},
               {"text": "5"}]))
    handle = await local.start(agent, input="2 + 3?")
    result = await handle.result(timeout_s=90)
    assert (result.status, result.output) == ("completed", "5")
    out, failed, safe = await _facts(handle)
    assert out["calc:t1:c0"].strip() == "5"
    assert failed["calc:t1:c1"].error_kind == "tool_error" and "exploded: on purpose" in failed["calc:t1:c1"].message
    assert safe == {"calc:t1:c0": True, "calc:t1:c1": True}  # idempotentHint; the workflow's override
    offered = {t["function"]["name"]: t["function"] for t in await _offered(handle, "calc:t1")}
    assert sorted(offered) == ["calc__add", "calc__explode"]
    assert offered["calc__add"]["description"] == "Add two integers."
    assert set(offered["calc__add"]["parameters"]["required"]) == {"a", "b"}


async def test_a_server_that_does_not_start_refuses_the_run(local: reel.Client) -> None:
    agent = reel.Agent(name="nope", instructions=".", tools=[reel.mcp_tools(command=["/nonexistent/mcp-server"])],
                       model=reel.ScriptedModel(turns=[{"text": "x"}]))
    with pytest.raises(reel.WorkflowInvalid) as refused:
        await local.start(agent, input="x")
    assert "/nonexistent/mcp-server" in refused.value.message and "tools[0].mcp" in refused.value.message


async def test_a_stdio_server_is_started_again_after_it_died_and_killed_with_the_executor() -> None:
    tools = reel.mcp_tools(name="own", command=[sys.executable, "-m", "tests.support.mcp_server"],
                           include=["pid", "die"])
    agent = reel.Agent(name="own", instructions=".", tools=[tools], model=reel.ScriptedModel(
        turns=[{"tool_calls": [{"name": "own__pid", "arguments": {}}]},
               {"tool_calls": [{"name": "own__die", "arguments": {}}]},
               {"tool_calls": [{"name": "own__pid", "arguments": {}}]},
               {"text": "ok"}]))
    async with reel.local() as client:
        handle = await client.start(agent, input="x")
        result = await handle.result(timeout_s=90)
        assert result.status == "completed"
        out, failed, _ = await _facts(handle)
        first, second = int(out["own:t1:c0"]), int(out["own:t3:c0"])
        assert failed["own:t2:c0"].error_kind == "mcp_unavailable"  # it died mid-call
        assert first != second  # started again on the next call
        assert _alive(second)
    assert not _alive(first) and not _alive(second)  # the executor's servers go with it


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_progress_goes_to_the_calls_stream_subject(local: reel.Client) -> None:
    tools = reel.mcp_tools(name="own", command=[sys.executable, "-m", "tests.support.mcp_server"], include=["count"])
    agent = reel.Agent(name="counter", instructions=".", tools=[tools], model=reel.ScriptedModel(
        turns=[{"tool_calls": [{"name": "own__count", "arguments": {"n": 3}}]}, {"text": "ok"}]))
    key = "mcp-progress-1"
    async with local.get(run_id_for_key(key)).stream() as stream:  # subscribed before the run exists
        handle = await local.start(agent, input="count", key=key)
        seen: list[tuple[str, int, tuple[float, float | None, str] | None, bool]] = []
        async for token in stream:
            if token.step_id == "counter:t1:c0":
                seen.append((token.step_id, token.attempt, token.progress, token.done))
                if len(seen) == 3:
                    break
    assert seen == [("counter:t1:c0", 1, (float(i), 3.0, f"at {i}"), False) for i in (1, 2, 3)]
    result = await handle.result(timeout_s=90)
    out, _, _ = await _facts(handle)
    assert result.status == "completed" and out["counter:t1:c0"] == "counted to 3"


async def test_a_call_past_its_timeout_is_cancelled_at_the_server(local: reel.Client, tmp_path: Path) -> None:
    marker = str(tmp_path / "held")
    tools = reel.mcp_tools(name="own", command=[sys.executable, "-m", "tests.support.mcp_server"],
                           include=["hold", "was_cancelled"], timeout_s=1.0)
    agent = reel.Agent(name="holder", instructions=".", tools=[tools], model=reel.ScriptedModel(
        turns=[{"tool_calls": [{"name": "own__hold", "arguments": {"marker": marker}}]},
               {"tool_calls": [{"name": "own__was_cancelled", "arguments": {}}]}, {"text": "ok"}]))
    handle = await local.start(agent, input="hold")
    result = await handle.result(timeout_s=90)
    out, failed, _ = await _facts(handle)
    assert result.status == "completed" and failed["holder:t1:c0"].error_kind == "timeout"
    assert out.get("holder:t2:c0") == marker, failed  # the server got notifications/cancelled for the held call


async def _asked(handle: reel.RunHandle) -> reel.PendingRequest:
    """The run's open request, once the executor committed it (read from the log as it moves)."""
    async for state in handle._rc.watch(handle.run_id):
        assert state.status in ("pending", "running", "awaiting_input"), state.status
        pending = await handle.pending()
        if pending:
            return pending[0]
    raise AssertionError("unreachable")


async def _reel_cli(client: reel.Client, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", *args, "--nats-url", client.url, "--namespace", client.namespace,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return int(proc.returncode or 0), out.decode(), err.decode()


async def test_an_elicitation_is_an_input_request_answered_with_reel_answer(local: reel.Client) -> None:
    tools = reel.mcp_tools(name="own", command=[sys.executable, "-m", "tests.support.mcp_server"], include=["paint"])
    agent = reel.Agent(name="painter", instructions=".", tools=[tools], model=reel.ScriptedModel(
        turns=[{"tool_calls": [{"name": "own__paint", "arguments": {"thing": "door"}}]},
               {"tool_calls": [{"name": "own__paint", "arguments": {"thing": "fence"}}]}, {"text": "ok"}]))
    handle = await local.start(agent, input="paint")
    asked = await _asked(handle)
    assert (asked.kind, asked.step_id, asked.tool) == ("elicitation", "painter:t1:c0", "own__paint"), asked
    assert asked.question == "Which colour for the door? (answer: color, string)", asked
    assert await handle.status() == "awaiting_input"  # the call is held open in the executor while it waits
    code, out, err = await _reel_cli(local, "pending", "--json")
    assert code == 0 and [p["request_id"] for p in json.loads(out)] == [asked.request_id], (out, err)
    code, out, err = await _reel_cli(local, "answer", handle.run_id, asked.request_id, "blue", "--no-wait")
    assert code == 0, (out, err)

    second = await _asked(handle)  # the next turn's call asks again: a new request
    assert second.step_id == "painter:t2:c0" and second.request_id != asked.request_id
    code, out, err = await _reel_cli(local, "reject", handle.run_id, second.request_id, "--note", "no", "--no-wait")
    assert code == 0, (out, err)
    result = await handle.result(timeout_s=90)
    out_by_step, failed, _ = await _facts(handle)
    assert result.status == "completed" and not failed, failed
    assert out_by_step["painter:t1:c0"] == "painted the door blue"  # the answer went back to the server
    assert out_by_step["painter:t2:c0"] == "the user declined (decline)"
    code, out, err = await _reel_cli(local, "answer", handle.run_id, asked.request_id, "red", "--no-wait")
    assert code == 1 and "request_answered" in err, (out, err)




async def test_a_cancel_while_an_elicitation_waits_ends_the_call(local: reel.Client) -> None:
    tools = reel.mcp_tools(name="own", command=[sys.executable, "-m", "tests.support.mcp_server"], include=["paint"])
    agent = reel.Agent(name="painter", instructions=".", tools=[tools], model=reel.ScriptedModel(
        turns=[{"tool_calls": [{"name": "own__paint", "arguments": {"thing": "gate"}}]}, {"text": "ok"}]))
    handle = await local.start(agent, input="paint")
    asked = await _asked(handle)
    cancelled = await handle.cancel("never mind")
    assert cancelled.cancelled and cancelled.previous_status == "awaiting_input", cancelled
    state = await handle.wait(("cancelled",), timeout_s=60)
    rec = state.branches["main"].requests[asked.step_id]
    assert rec.status == "closed" and await handle.pending() == []
    async with asyncio.timeout(30):  # the held call is told `cancel`, returns, and is recorded cancelled
        async for state in handle._rc.watch(handle.run_id):
            if state.branches["main"].attempts[asked.step_id][-1].status != "dispatched":
                break
    assert state.branches["main"].attempts[asked.step_id][-1].status == "cancelled"
