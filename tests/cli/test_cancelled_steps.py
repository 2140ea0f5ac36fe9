"""A step the run's cancel stopped in flight reads ``cancelled`` — in the view, ``reel show`` (table and ``--json``)
and the web UI — while the fold (and so every golden ``.state.json``) is unchanged: the agent step of a cancelled
agent run used to read ``running`` for ever."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from reel.services.cancel.app import serve as cancel_serve
from reel.shared.core.run.fold import fold
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.golden.regen import logs, read_log
from tests.integration import cancel_support as cs
from tests.integration.scenarios import wait_until
from tests.ui.support import env_for, reel, reel_ui

WAIT_S = 60.0


def _golden(name: str) -> RunState:
    [path] = [p for p in logs() if p.stem == name]
    state = fold(read_log(path))
    assert state is not None
    return state


def test_golden_cancelled_runs_read_cancelled_where_the_cancel_stopped_them() -> None:
    state = _golden("hand_cancel_in_flight")  # an agent cancelled with two tool calls in flight
    steps = {s.step_id: s.status for s in build_episode_view(state).steps}
    assert steps == {"fetch": "succeeded", "solve": "cancelled", "solve:t1": "succeeded", "solve:t1:c0": "cancelled",
                     "solve:t1:c1": "cancelled"}
    forked = _golden("hand_fork_verdicts_cancel")  # cancelled on branch b-1 with `act` dispatched, no outcome
    view = build_episode_view(forked)
    assert [(s.step_id, s.status) for s in view.steps] == [("plan", "succeeded"), ("act", "cancelled"),
                                                           ("review", "pending")]  # never started: pending
    assert view.step("act").attempts[0].status == "dispatched"  # the attempt stays as recorded
    assert [s.status for s in build_episode_view(forked, "main").steps] == ["succeeded"] * 3  # not the one stopped


@pytest.fixture
async def cancel_service(infra: Infra, cfg: Config, executor: None) -> AsyncIterator[None]:
    async with running(cancel_serve, infra, cfg):
        yield


async def test_show_and_the_ui_say_cancelled_for_the_agent_step_a_cancel_stopped(
    cancel_service: None, infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path,
) -> None:
    gate = cs.arm()
    tool = {"name": "wait", "python": "tests.integration.cancel_support:wait_forever", "timeout_s": 60,
            "parameters": {"type": "object", "properties": {"token": {"type": "string"}}}}
    wf = {"name": "cancel-agent", "steps": [
        {"kind": "agent", "id": "solve", "instructions": "Work.", "max_turns": 3,
         "context": [{"id": "task", "kind": "task", "text": "wait"}],
         "model": {"adapter": "scripted", "turns": [
             {"tool_calls": [{"name": "wait", "arguments": {"token": gate.token}}]}, {"text": "done"}]},
         "tools": [tool]},
        {"kind": "tool", "id": "next", "tool": {"type": "scripted", "outputs": ["never"]}}]}
    reply = await client.start(parse_workflow(wf))
    assert reply.ok and reply.run_id, reply
    run_id = reply.run_id
    await asyncio.wait_for(gate.started.wait(), WAIT_S)  # the tool call is in flight
    assert (await client.cancel(run_id, "user pressed stop")).ok
    await asyncio.wait_for(gate.stopped.wait(), WAIT_S)

    async def recorded() -> bool:
        state = await event_log.load(run_id)
        return state.status == "cancelled" and any(
            a.status == "cancelled" for a in state.branches["main"].attempts.get("solve:t1:c0", ()))  # type: ignore[call-overload]

    await wait_until(recorded, timeout_s=WAIT_S, what="the cancelled attempt to be recorded")

    env = env_for(tmp_path)
    code, shown, err = await reel(cfg, "show", run_id, env=env)
    assert code == 0, err
    assert re.search(r"agent solve: cancelled, 1 turn, 1 tool call", shown), shown
    row = next(line for line in shown.splitlines() if line.startswith("│ solve ") and "│ agent " in line)
    assert [c.strip() for c in row.strip("│").split("│")][:4] == ["solve", "agent", "-", "cancelled"], row
    assert "running" not in shown.split("branch main")[1], shown
    code, js, err = await reel(cfg, "show", run_id, "--json", env=env)
    assert code == 0, err
    statuses = {s["step_id"]: s["status"] for s in json.loads(js)["steps"]}
    assert statuses == {"solve": "cancelled", "solve:t1": "succeeded", "solve:t1:c0": "cancelled",
                        "next": "pending"}, statuses

    async with reel_ui(cfg, env=env) as url, aiohttp.ClientSession() as http, http.get(f"{url}/runs/{run_id}") as r:
        page = html.unescape(await r.text())
    assert r.status == 200
    assert re.search(r'data-step="solve" data-kind="agent" data-status="cancelled"', page), page[:2000]
    assert 'data-status="running"' not in page
