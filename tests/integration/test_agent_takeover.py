"""Agent steps across an executor's death: kill -9 between a tool's intent and its outcome (a real executor
subprocess, real HTTP to the loopback chat server), and a turn's answer recorded while nobody acted on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from reel.services.executor.app import serve as executor_serve
from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptSucceeded,
    DeclaredStep,
    RunCreated,
    RunStarted,
    StepsDeclared,
)
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.commands import ResumeRun, encode
from reel.shared.core.wire.subjects import outcome_key
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running
from tests.integration.agent_support import LOOKUP, agent_workflow, checks_tool, runs_of
from tests.integration.agent_tools import HOLD_ENV, arm
from tests.integration.scenarios import attempt_of, commit_events, wait_until
from tests.refold import assert_refold_identical
from tests.support.chat_server import ChatServer, call, reply


# ---- kill -9 between a tool's intent and its outcome --------------------------------------------------------
@pytest.fixture
async def doomed_executor(cfg: Config, tmp_path: Path, api_key: str) -> AsyncIterator[tuple[asyncio.subprocess.Process,
                                                                                            Path]]:
    """An executor subprocess whose tools hold attempt 1 forever (``$REEL_TEST_HOLD_DIR``)."""
    hold = tmp_path / "hold"
    hold.mkdir()
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace, HOLD_ENV: str(hold),
           "REEL_LEASE_TTL_S": str(cfg.lease_ttl_s), "REEL_LOG_FORMAT": "json", "REEL_COMMAND_ACK_WAIT_S": "120"}
    log_path = tmp_path / "doomed-executor.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.executor", cwd=REPO, env=env,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
    try:
        yield proc, hold
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert api_key not in log_path.read_text(), "the API key in the executor's log"


async def test_kill_9_mid_tool_reruns_a_retry_safe_call_once_and_records_the_other_outcome_unknown(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, chat_server: ChatServer,
    api_key: str, log_dir: Path, doomed_executor: tuple[asyncio.subprocess.Process, Path],
) -> None:
    proc, hold = doomed_executor
    charge = {"name": "charge", "python": "tests.integration.agent_tools:charge",
              "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}}
    chat_server.script(reply(None, [call("charge", {"amount": 5}, id="pay"), call("run_checks", {}, id="check")]),
                       reply("Charged (maybe) and checked."))
    started = await client.start(agent_workflow(chat_server, [charge, checks_tool(log_dir)]))
    assert started.ok and started.run_id
    run = started.run_id
    await wait_until(lambda: _both_started(hold), timeout_s=60, what="both tools of turn 1 to be running")
    held = await event_log.load(run)
    assert [a.status for a in (attempt_of(held, "solve:t1:c0", 1), attempt_of(held, "solve:t1:c1", 1))] == [
        "dispatched", "dispatched"]
    proc.kill()  # SIGKILL: between both tools' intents and their outcomes
    assert await proc.wait() == -9
    await assert_refold_identical(event_log, await event_log.load(run))

    async with running(executor_serve, infra, cfg):
        assert (await client.command("resume", encode(ResumeRun(run_id=run)), timeout_s=15)).ok
        state = await client.wait_for(run, ("verifying",), timeout_s=60)
    pay = state.branches["main"].attempts["solve:t1:c0"]
    assert [(a.attempt, a.status, a.error_kind, a.retryable) for a in pay] == [
        (1, "failed", "outcome_unknown", False)]  # never re-run
    assert sorted(p.name for p in hold.iterdir()) == ["charge.1.started", "command.1.started"]
    check = state.branches["main"].attempts["solve:t1:c1"]
    assert [(a.attempt, a.status) for a in check] == [(1, "dispatched"), (2, "succeeded")]  # re-run once
    runs = runs_of(log_dir)
    assert [r["attempt"] for r in runs] == [1, 2] and len({r["idempotency_key"] for r in runs}) == 1
    assert check[1].executor_id != check[0].executor_id
    tools_seen = [m for m in chat_server.requests[-1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools_seen] == ["pay", "check"]
    assert tools_seen[0]["content"].startswith("error (outcome_unknown):")  # the model is told
    assert json.loads(tools_seen[1]["content"])["attempt"] == 2
    dispatched_t2 = [e for _, c in await event_log.read(run) for e in c.events
                     if isinstance(e, AttemptDispatched) and e.step_id == "solve:t2"]
    assert len(dispatched_t2) == 1
    await assert_refold_identical(event_log, state)


async def _both_started(hold: Path) -> bool:
    names = await asyncio.to_thread(lambda: {p.name for p in hold.iterdir()})
    return names == {"charge.1.started", "command.1.started"}


# ---- a dead executor's run, made by hand ------------------------------------------------------------------------
ANSWER = json.dumps({"role": "assistant", "content": None, "tool_calls": [
    {"id": "", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "answer"}'}}]}).encode()


async def dead_executors_turn(event_log: JetStreamEventLog, blobs: JetStreamBlobStore, run: str) -> AttemptSucceeded:
    """A run whose executor ``x-dead`` dispatched turn 1, whose answer (one ``lookup`` call, no id) is stored:
    returns the turn's success event, not committed (the caller decides what was committed)."""
    spec = parse_workflow({"name": "dead", "steps": [{
        "kind": "agent", "id": "solve", "max_attempts": 2, "context": [{"id": "task", "kind": "task", "text": "go"}],
        "model": {"adapter": "scripted", "turns": [{"text": "never played"}, {"text": "done after the takeover"}]},
        "tools": [LOOKUP]}]})
    workflow_ref = await blobs.put(encode_workflow(spec), "application/json")
    await commit_events(event_log, run, RunCreated(run_id=run, branch_id="main", workflow_name=spec.name,
                                                   workflow_ref=workflow_ref, steps=spec.decls(), created_ms=1))
    await commit_events(event_log, run, RunStarted(executor_id="x-dead", at_ms=2))
    await commit_events(event_log, run, StepsDeclared(branch_id="main", parent_step="solve", steps=(
        DeclaredStep(step_id="solve:t1", kind="turn", turn=1, max_attempts=2),)),
        AttemptDispatched(branch_id="main", step_id="solve:t1", attempt=1, executor_id="x-dead", at_ms=3))
    answer_ref = await blobs.put(ANSWER, "application/json")
    return AttemptSucceeded(branch_id="main", step_id="solve:t1", attempt=1, output_ref=answer_ref, at_ms=4)


async def take_over(infra: Infra, cfg: Config, client: ReelClient, run: str) -> RunState:
    async with running(executor_serve, infra, cfg):
        assert (await client.command("resume", encode(ResumeRun(run_id=run)), timeout_s=15)).ok
        return await client.wait_for(run, ("verifying",), timeout_s=30)


async def test_a_recorded_answer_nobody_acted_on_is_adopted_and_its_calls_run(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
) -> None:
    """Recovery recorded turn 1's answer from its marker (its executor died before the outcome commit): the next
    executor declares the answer's calls with their intents in one commit, runs them, and goes on to turn 2."""
    run = "r-adopt"
    answered = await dead_executors_turn(event_log, blobs, run)
    adopted_at = await commit_events(event_log, run, msgspec.structs.replace(answered, recovered=True))
    state = await take_over(infra, cfg, client, run)
    commits = [(lsn, c) for lsn, c in await event_log.read(run) if lsn > adopted_at]
    adopting = [type(e).__name__ for e in commits[1][1].events]  # after the new executor's claim
    assert adopting == ["StepsDeclared", "AttemptDispatched"]
    rec = state.branches["main"].agents["solve"]  # type: ignore[index]
    assert [c.decl.call_id for c in rec.turns[0].calls] == ["call_t1_0"]  # an empty provider id: Reel's
    assert attempt_of(state, "solve:t1:c0", 1).status == "succeeded"
    assert rec.finished is not None and (rec.finished.status, rec.finished.turns) == ("succeeded", 2)
    assert json.loads(await blobs.get(rec.finished.output_ref))["content"] == "done after the takeover"  # type: ignore
    await assert_refold_identical(event_log, state)


async def test_an_orphaned_call_whose_result_marker_was_stored_is_recorded_not_unknown(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
) -> None:
    """The dead executor stored a non-retry-safe call's result and its marker, then died before the outcome
    commit: the result is known, so the next executor records it (``recovered``), never ``outcome_unknown``."""
    run = "r-marker"
    answered = await dead_executors_turn(event_log, blobs, run)
    await commit_events(event_log, run, answered, StepsDeclared(branch_id="main", parent_step="solve", steps=(
        DeclaredStep(step_id="solve:t1:c0", kind="tool_call", turn=1, call_id="call_t1_0", tool_name="lookup",
                     arguments='{"key": "answer"}'),)),
        AttemptDispatched(branch_id="main", step_id="solve:t1:c0", attempt=1, executor_id="x-dead", at_ms=5))
    result = await blobs.put(b"42, as stored by the dead executor")
    await infra.outcomes.put(outcome_key(run, "main", "solve:t1:c0", 1), msgspec.json.encode(result))
    state = await take_over(infra, cfg, client, run)
    c0 = state.branches["main"].attempts["solve:t1:c0"]
    assert [(a.attempt, a.status, a.recovered, a.output_ref) for a in c0] == [(1, "succeeded", True, result)]
    prompt = attempt_of(state, "solve:t2", 1).prompt_ref
    assert prompt is not None
    tool_messages = [m for m in json.loads(await blobs.get(prompt))["messages"] if m["role"] == "tool"]
    assert tool_messages == [{"role": "tool", "content": "42, as stored by the dead executor",
                              "tool_call_id": "call_t1_0"}]
    await assert_refold_identical(event_log, state)


async def test_a_stopping_executor_records_the_calls_in_flight_starts_nothing_new_and_hands_back(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog,
) -> None:
    arrived, release = arm("handback")
    parking = {"name": "park", "python": "tests.integration.agent_tools:park",
               "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}
    spec = parse_workflow({"name": "agent-handback", "steps": [{
        "kind": "agent", "id": "solve", "context": [{"id": "task", "kind": "task", "text": "go"}],
        "model": {"adapter": "scripted", "turns": [
            {"tool_calls": [{"name": "park", "arguments": {"name": "handback"}},
                            {"name": "lookup", "arguments": {"key": "answer"}}]},
            {"text": "answered by the next executor"}]},
        "tools": [parking, LOOKUP]}]})
    async with running(executor_serve, infra, cfg) as stop_a:  # A
        started = await client.start(spec)
        assert started.run_id
        await asyncio.wait_for(arrived.wait(), 30)  # A runs turn 1's calls
        stop_a.set()
        release.set()
    # A drained (the block awaited it): both results recorded, then it handed the run back
    mid = await event_log.load(started.run_id)
    assert mid.status == "running"
    assert [mid.branches["main"].attempts[f"solve:t1:c{i}"][0].status for i in (0, 1)] == ["succeeded"] * 2
    assert "solve:t2" not in mid.branches["main"].attempts  # no new model call under a stop

    async with running(executor_serve, infra, cfg):  # B
        state = await client.wait_for(started.run_id, ("verifying",), timeout_s=30)
    assert len(state.branches["main"].attempts["solve:t1:c0"]) == 1  # not repeated
    assert attempt_of(state, "solve:t2", 1).executor_id != attempt_of(state, "solve:t1", 1).executor_id
    await assert_refold_identical(event_log, state)
