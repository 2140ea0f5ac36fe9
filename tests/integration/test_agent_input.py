"""Human input as a resting state, end to end: a real nats-server, the real executor, the cancel
service answering ``<ns>.cmd.respond``, recovery firing deadlines, the real ``openai`` client over HTTP to the
loopback chat-completions server. No mocks; every wait is on the log (rendezvous), never a sleep.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from reel.services.cancel.app import serve as cancel_serve
from reel.services.executor.app import serve as executor_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.shared.core.input import requestfold
from reel.shared.core.run.events import AttemptDispatched, InputAnswered, InputRequested
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import build_episode_view
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.agent_support import agent_workflow, commits_of
from tests.integration.scenarios import attempt_of, wait_state
from tests.refold import assert_refold_identical
from tests.support.chat_server import ChatServer, call, reply

WRITE = {"name": "write_file", "description": "Write a file.", "python": "tests.integration.input_tools:write_file",
         "needs_approval": True, "input": {"ask": "the file owner"},
         "parameters": {"type": "object", "required": ["path"],
                        "properties": {"path": {"type": "string"}, "text": {"type": "string"}}}}
ASK = {"name": "ask_user", "builtin": "ask_user"}


pytestmark = pytest.mark.usefixtures("api_key")  # tests/integration/conftest.py


@contextlib.asynccontextmanager
async def services(infra: Infra, cfg: Config, **recovery: Any) -> AsyncIterator[None]:
    """Every service this part needs, in-process: executor, cancel (+ respond), recovery (its sweep on)."""
    async with running(executor_serve, infra, cfg), running(cancel_serve, infra, cfg), \
            running(recovery_serve, infra, cfg, **recovery):
        yield


def open_ids(state: RunState) -> list[str]:
    return [r.request_id for r in requestfold.open_requests(state.active)]


async def until(event_log: JetStreamEventLog, run_id: str, pred: Callable[[RunState], bool], what: str) -> RunState:
    return await wait_state(event_log, run_id, pred, timeout_s=30, what=what)


async def test_two_parallel_approvals_answered_out_of_order_across_a_restart_of_every_service(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer,
    tmp_path: Path,
) -> None:
    a, b, b2 = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "b2.txt"
    chat_server.script(reply(None, [call("write_file", {"path": str(a), "text": "A"}, id="call_a"),
                                    call("write_file", {"path": str(b), "text": "B"}, id="call_b")]),
                       reply("both written"))
    spec = agent_workflow(chat_server, [WRITE])
    async with services(infra, cfg):
        started = await client.start(spec)
        assert started.ok and started.run_id
        run_id = started.run_id
        waiting = await client.wait_for(run_id, ("awaiting_input", "verifying"), timeout_s=30)
    assert waiting.status == "awaiting_input"
    first, second = open_ids(waiting)
    assert not a.exists() and not b.exists()  # nothing ran before its approval
    asked = [e for c in await commits_of(event_log, run_id) for e in c.events if isinstance(e, InputRequested)]
    assert [(e.step_id, e.call_id, e.asked) for e in asked] == [("solve:t1:c0", "call_a", "the file owner"),
                                                                ("solve:t1:c1", "call_b", "the file owner")]

    async with services(infra, cfg):  # every service is a new instance: the requests are in the log only
        late = await client.respond(run_id, second, "approve", arguments={"path": str(b2), "text": "edited"}, by="ana")
        assert late.ok and late.detail["resume"] == "published" and late.status == "running", late
        state = await until(event_log, run_id, lambda s: s.status == "awaiting_input" and bool(
            s.branches["main"].attempts.get("solve:t1:c1")), "the second call to run and the run to wait again")
        assert open_ids(state) == [first] and b2.read_text() == "edited" and not b.exists() and not a.exists()
        early = await client.respond(run_id, first, "approve")
        assert early.ok and early.detail["resume"] == "published", early
        state = await client.wait_for(run_id, ("verifying",), timeout_s=30)
    assert a.read_text() == "A" and b2.read_text() == "edited" and not b.exists()
    assert [attempt_of(state, s, 1).status for s in ("solve:t1:c0", "solve:t1:c1")] == ["succeeded", "succeeded"]
    sent = chat_server.requests[1].body["messages"]
    assert sent[-1]["content"].startswith(f'(approved with edited arguments: {{"path":"{b2}","text":"edited"}})\n')
    view = build_episode_view(state)
    assert [(s.step_id, r.status, r.response.by if r.response else None) for s, r in view.requests()] == [
        ("solve:t1:c0", "approved", ""), ("solve:t1:c1", "approved", "ana")]
    await assert_refold_identical(event_log, state)


async def test_a_rejection_and_an_answer_reach_the_model_and_bad_responses_are_refused(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer,
    tmp_path: Path,
) -> None:
    target = tmp_path / "prod.cfg"
    chat_server.script(reply(None, [call("write_file", {"path": str(target)}, id="w"),
                                    call("ask_user", {"question": "Which region?"}, id="q")]),
                       reply("ok, not writing"))
    async with services(infra, cfg):
        started = await client.start(agent_workflow(chat_server, [WRITE, ASK]))
        assert started.run_id
        run_id = started.run_id
        waiting = await client.wait_for(run_id, ("awaiting_input",), timeout_s=30)
        write, question = open_ids(waiting)
        refused = await client.respond(run_id, "q-000000000000", "approve")
        assert not refused.ok and refused.error and refused.error.code == "request_not_found"
        refused = await client.respond(run_id, write, "approve", arguments={"text": "no path"})
        assert not refused.ok and refused.error and refused.error.code == "invalid_command"
        assert "'path' is a required property (at `$.arguments`)" in refused.error.message
        refused = await client.respond(run_id, question, "approve")
        assert not refused.ok and refused.error and "takes answer or reject" in refused.error.message
        assert (await client.respond(run_id, question, "answer", text="eu-west-1")).ok
        assert (await client.respond(run_id, write, "reject", note="prod.cfg is frozen this week")).ok
        dup = await client.respond(run_id, write, "reject", note="prod.cfg is frozen this week")
        assert dup.ok and dup.detail["noop"] and dup.detail["reason"].startswith("duplicate"), dup
        other = await client.respond(run_id, write, "approve")
        assert not other.ok and other.error and other.error.code == "request_answered"
        state = await client.wait_for(run_id, ("verifying",), timeout_s=30)
    assert not target.exists()
    results = [m for m in chat_server.requests[1].body["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in results] == [
        ("w", "error (rejected): the approver rejected this call: prod.cfg is frozen this week"),
        ("q", "eu-west-1")]
    assert not state.branches["main"].attempts.get("solve:t1:c0")  # the rejected call never ran
    answers = [e for c in await commits_of(event_log, run_id) for e in c.events if isinstance(e, InputAnswered)]
    assert [(e.decision, e.source) for e in answers] == [("answer", "respond"), ("reject", "respond")]


async def test_a_deadline_fires_its_default_once(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer,
    tmp_path: Path,
) -> None:
    tool = {**WRITE, "input": {"ask": "ops", "timeout_s": 0.3, "default": "reject", "note": "nobody approved"}}
    chat_server.script(reply(None, [call("write_file", {"path": str(tmp_path / "x")}, id="w")]), reply("gave up"))
    async with services(infra, cfg, sweep_interval_s=30):  # the sweep wakes for the deadline, not its interval
        started = await client.start(agent_workflow(chat_server, [tool]))
        assert started.run_id
        run_id = started.run_id
        state = await client.wait_for(run_id, ("verifying",), timeout_s=30)
        (request,) = requestfold.requests_of(state.branches["main"]).values()
        assert request.response is not None and request.deadline_ms is not None
        assert (request.response.decision, request.response.source) == ("reject", "deadline")
        assert request.response.at_ms >= request.deadline_ms
        again = await client.command("recover", msgspec.json.encode({"run_id": run_id}))
        assert again.ok and again.detail["deadlines"] == []  # once: the request is no longer due
        late = await client.respond(run_id, request.request_id, "approve")
        assert late.ok and late.detail["noop"] and late.detail["reason"].startswith("late: "), late
    answers = [e for c in await commits_of(event_log, run_id) for e in c.events if isinstance(e, InputAnswered)]
    assert len(answers) == 1
    tool_msg = chat_server.requests[1].body["messages"][-1]
    assert tool_msg["content"] == "error (rejected): nobody answered before the deadline; rejected by default: " \
                                  "nobody approved"


async def test_cancel_while_awaiting_input_closes_the_open_requests(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer,
    tmp_path: Path,
) -> None:
    chat_server.script(reply(None, [call("write_file", {"path": str(tmp_path / "x")}, id="w")]))
    async with services(infra, cfg):
        started = await client.start(agent_workflow(chat_server, [WRITE]))
        assert started.run_id
        run_id = started.run_id
        waiting = await client.wait_for(run_id, ("awaiting_input",), timeout_s=30)
        (request,) = open_ids(waiting)
        cancelled = await client.cancel(run_id, "not today")
        assert cancelled.ok and cancelled.detail["previous_status"] == "awaiting_input", cancelled
        late = await client.respond(run_id, request, "approve")
        assert late.ok and late.detail["noop"] and "cancelled" in late.detail["reason"]
    state = await event_log.load(run_id)
    (rec,) = requestfold.requests_of(state.branches["main"]).values()
    assert (state.status, rec.status, rec.closed_lsn) == ("cancelled", "closed", state.head_lsn)
    assert not any(isinstance(e, AttemptDispatched) and e.step_id == "solve:t1:c0"
                   for c in await commits_of(event_log, run_id) for e in c.events)
    assert json.loads(msgspec.json.encode(build_episode_view(state)))["steps"][-1]["input"]["closed_lsn"] == \
        state.head_lsn


async def test_a_rewind_from_awaiting_input_asks_again_on_the_new_branch(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer,
    tmp_path: Path,
) -> None:
    from reel.services.rewind.app import serve as rewind_serve

    chat_server.script(reply(None, [call("write_file", {"path": str(tmp_path / "x")}, id="w")]),
                       reply(None, [call("write_file", {"path": str(tmp_path / "y")}, id="w")]))
    async with services(infra, cfg), running(rewind_serve, infra, cfg):
        started = await client.start(agent_workflow(chat_server, [WRITE]))
        assert started.run_id
        run_id = started.run_id
        (old,) = open_ids(await client.wait_for(run_id, ("awaiting_input",), timeout_s=30))
        forked = await client.rewind(run_id, at_step="solve:t1")
        assert forked.ok and forked.detail["resume"] == "published", forked
        state = await until(event_log, run_id, lambda s: s.status == "awaiting_input" and s.active_branch != "main",
                            "the new branch to ask again")
    (new,) = open_ids(state)
    assert new != old and requestfold.find(state.branches["main"], old) is not None
