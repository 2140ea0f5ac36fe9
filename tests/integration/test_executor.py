"""The executor service on a real nats-server.

Intent before side effect is checked from the side effect itself: a command tool step
reads the run's head from the stream at the moment it runs and appends it to a file.
Takeovers use a real crashed executor process and real JetStream redelivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing

from reel.services.executor.app import ports, serve
from reel.services.executor.attempts import CRASH_ENV
from reel.services.executor.handler import Executor
from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    Commit,
    RunCreated,
    RunStarted,
    decode_commit,
)
from reel.shared.core.run.ids import run_id_for_key
from reel.shared.core.run.planning import succeeded_output
from reel.shared.core.run.state import RunState, branch_failed, step_status
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.wire.commands import Reply, StartRun, encode
from reel.shared.core.wire.subjects import REPLY_TO_HEADER
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import CommandTimeout, ReelClient
from reel.shared.nats.consumer import CommandConsumer
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running
from tests.refold import assert_refold_identical

# Runs as the side effect of a tool step: what is the run's last commit *now*?
HEAD_PROBE = r"""
import asyncio, json, sys
import nats
async def main():
    url, stream, subject, path = sys.argv[1:5]
    nc = await nats.connect(url)
    msg = await nc.jetstream().get_last_msg(stream, subject)
    await nc.close()
    with open(path, "a") as f:
        f.write(json.dumps({"seq": msg.seq, "commit": json.loads(msg.data)}) + "\n")
    print("side effect done")
asyncio.run(main())
"""


def probe_tool(cfg: Config, run_id: str, path: Path) -> dict[str, Any]:
    argv = [sys.executable, "-c", HEAD_PROBE, cfg.nats_url, cfg.names.events_stream, cfg.names.events(run_id),
            str(path)]
    return {"type": "command", "name": "probe", "argv": argv, "timeout_s": 30}


def scripted_model(step_id: str, outputs: list[Any], **kw: Any) -> dict[str, Any]:
    return {"kind": "model", "id": step_id, "model": {"adapter": "scripted", "outputs": outputs}, **kw}


def tool(step_id: str, spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"kind": "tool", "id": step_id, "tool": spec, **kw}


def recorded(step_id: str, output: str = "ok") -> dict[str, Any]:
    return tool(step_id, {"type": "recorded", "output": output})


def events_of(commits: list[tuple[int, Commit]]) -> list[tuple[int, Any]]:
    return [(lsn, e) for lsn, c in commits for e in c.events]


def assert_intents_precede_outcomes(state: RunState, commits: list[tuple[int, Commit]]) -> None:
    for atts in state.active.attempts.values():
        for a in atts:
            assert a.outcome_lsn is None or a.dispatched_lsn < a.outcome_lsn, (a.step_id, a.attempt)
    dispatched_at: dict[tuple[str, str, int], int] = {}
    for lsn, e in events_of(commits):
        if isinstance(e, AttemptDispatched):
            dispatched_at[(e.branch_id, e.step_id, e.attempt)] = lsn
        elif isinstance(e, AttemptSucceeded | AttemptFailed):
            assert dispatched_at[(e.branch_id, e.step_id, e.attempt)] < lsn


def assert_single_writer(commits: list[tuple[int, Commit]]) -> None:
    """Fencing: after each claim (run_started), only the claimant drives the run, until the next claim.

    A former owner may still record the outcome of an attempt *it* dispatched (the side effect
    happened; the outcome is a fact), but it never claims, dispatches or moves the run.
    """
    owner: str | None = None
    dispatched_by: dict[tuple[str, int], str] = {}
    for _, c in commits[1:]:
        for e in c.events:
            if isinstance(e, RunStarted):
                owner = e.executor_id
                assert c.writer == owner
            elif isinstance(e, AttemptDispatched):
                assert e.executor_id == owner
                dispatched_by[(e.step_id, e.attempt)] = e.executor_id
        if c.writer != owner:
            late = [e for e in c.events if isinstance(e, AttemptSucceeded | AttemptFailed)]
            assert late and len(late) == len(c.events), f"{c.writer} drove the run while {owner} owned it"
            assert all(dispatched_by[(e.step_id, e.attempt)] == c.writer for e in late), \
                f"{c.writer} wrote an outcome for an attempt it did not dispatch"


async def start(client: ReelClient, workflow: dict[str, Any], key: str | None = None) -> Reply:
    reply = await client.start(parse_workflow(workflow), idempotency_key=key, timeout_s=30)
    assert reply.ok and reply.run_id, reply
    return reply


# ---- a run, end to end ---------------------------------------------------------------------------


async def test_run_goes_to_verifying_with_intents_before_side_effects(
        executor: None, client: ReelClient, event_log: JetStreamEventLog, cfg: Config, tmp_path: Path) -> None:
    key = "happy-path"
    run_id = run_id_for_key(key)
    effects = tmp_path / "effects.jsonl"
    workflow = {
        "name": "happy",
        "steps": [
            scripted_model("plan", ["step 1: probe"], instructions="Plan.",
                           context=[{"id": "task", "text": "fix the bug in parser.py"},
                                    {"id": "noise", "text": "irrelevant", "kind": "scratch"}],
                           policy={"exclude_kinds": ["scratch"]}),
            tool("act", probe_tool(cfg, run_id, effects)),
            {"kind": "model", "id": "review", "include_previous_outputs": True,
             "model": {"adapter": "replay", "output": "looks right",
                       "usage": {"input_tokens": 100, "output_tokens": 5, "cost_usd": 0.01}}},
        ],
    }
    reply = await start(client, workflow, key)
    assert (reply.run_id, reply.created, reply.status) == (run_id, True, "pending")
    state = await client.wait_for(run_id, ("verifying",), timeout_s=60)
    commits = await event_log.read(run_id)

    kinds = [type(e).__name__ for _, e in events_of(commits)]
    assert kinds == ["RunCreated", "RunStarted"] + ["AttemptDispatched", "AttemptSucceeded"] * 3 + ["RunVerifying"]
    assert reply.lsn == commits[0][0]
    assert_intents_precede_outcomes(state, commits)
    assert state.verifying_lsn == commits[-1][0] and state.status == "verifying"
    assert all(step_status(state, "main", s) == "succeeded" for s in ("plan", "act", "review"))

    # the side effect ran once, after its intent was the run's last commit
    act = state.branches["main"].attempts["act"][0]
    lines = effects.read_text().splitlines()
    assert len(lines) == 1
    seen = json.loads(lines[0])
    assert seen["seq"] == act.dispatched_lsn
    # one round trip per step: plan's outcome carries act's intent, and that commit was the run's last
    assert [(e["type"], e["step_id"], e["attempt"]) for e in seen["commit"]["events"]] == [
        ("attempt_succeeded", "plan", 1), ("attempt_dispatched", "act", 1)]
    assert act.outcome_lsn is not None and act.outcome_lsn > seen["seq"]
    assert act.output_ref is not None and await client.blobs.get_text(act.output_ref) == "side effect done\n"

    # usage: counted tokens for scripted, recorded usage for replay, latency for everything
    plan, review = state.branches["main"].attempts["plan"][0], state.branches["main"].attempts["review"][0]
    assert plan.usage.input_tokens > 0 and plan.usage.output_tokens > 0 and plan.usage.latency_ms > 0
    assert (review.usage.input_tokens, review.usage.output_tokens, review.usage.cost_usd) == (100, 5, 0.01)
    assert act.usage.latency_ms > 0
    prompt = await client.blobs.get_text(plan.prompt_ref)
    assert "fix the bug in parser.py" in prompt and "irrelevant" not in prompt
    assert plan.context is not None and plan.context.dropped == ("noise",)
    await assert_refold_identical(event_log, state)


async def test_retries_are_new_attempts_and_failures_stay_in_the_log(
        executor: None, client: ReelClient, event_log: JetStreamEventLog) -> None:
    workflow = {
        "name": "retries",
        "steps": [
            scripted_model("draft", [{"error": "rate_limited", "message": "429 slow down"},
                                     {"error": "timeout", "message": "model took too long"}, "third time lucky"],
                           max_attempts=3, context=[{"id": "t", "text": "write a haiku"}]),
            tool("flaky", {"type": "command", "argv": ["sh", "-c", "echo broken >&2; exit 3"]}, max_attempts=2),
            recorded("after"),
        ],
    }
    reply = await start(client, workflow)
    state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    atts = state.branches["main"].attempts
    assert [(a.attempt, a.status, a.error_kind, a.error_message) for a in atts["draft"]] == [
        (1, "failed", "rate_limited", "429 slow down"), (2, "failed", "timeout", "model took too long"),
        (3, "succeeded", None, None)]
    assert all(a.usage.latency_ms > 0 for a in atts["draft"])
    # a failed call reported no usage: 0 tokens, source none (nothing is counted); the answer's are Reel's count
    assert [(a.usage.input_tokens > 0, a.usage.source) for a in atts["draft"]] == [
        (False, "none"), (False, "none"), (True, "estimated")]
    assert [(a.attempt, a.status, a.error_kind) for a in atts["flaky"]] == [(1, "failed", "exit_3"),
                                                                            (2, "failed", "exit_3")]
    assert all("broken" in (a.error_message or "") and a.retryable for a in atts["flaky"])
    assert "after" not in atts
    assert [step_status(state, "main", s) for s in ("draft", "flaky", "after")] == ["succeeded", "failed", "skipped"]
    assert state.status == "verifying" and branch_failed(state, "main")
    assert build_episode_view(state).failed_attempts == 4
    assert_intents_precede_outcomes(state, await event_log.read(state.run_id))


async def test_non_retryable_failure_ends_the_step_and_skips_the_rest(
        executor: None, client: ReelClient, event_log: JetStreamEventLog) -> None:
    workflow = {
        "name": "fatal",
        "steps": [
            recorded("fetch"),
            scripted_model("think", [{"error": "bad_request", "message": "prompt too long", "retryable": False},
                                     "never reached"], max_attempts=5),
            recorded("write"),
            recorded("ship"),
        ],
    }
    reply = await start(client, workflow)
    state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    think = state.branches["main"].attempts["think"]
    assert [(a.status, a.error_kind, a.error_message, a.retryable) for a in think] == [
        ("failed", "bad_request", "prompt too long", False)]
    assert set(state.branches["main"].attempts) == {"fetch", "think"}
    assert [step_status(state, "main", s) for s in ("fetch", "think", "write", "ship")] == [
        "succeeded", "failed", "skipped", "skipped"]
    assert state.status == "verifying"
    await assert_refold_identical(event_log, state)


# ---- starting ------------------------------------------------------------------------------------


async def test_repeated_start_with_an_idempotency_key_returns_the_same_run(
        executor: None, client: ReelClient, event_log: JetStreamEventLog) -> None:
    workflow = {"name": "idem", "steps": [recorded("only")]}
    first = await start(client, workflow, "same-key")
    await client.wait_for(first.run_id, ("verifying",), timeout_s=30)
    again = await start(client, workflow, "same-key")
    assert (again.run_id, again.created, again.status, again.lsn) == (first.run_id, False, "verifying", 0)
    racing = await asyncio.gather(*(start(client, workflow, "racing-key") for _ in range(5)))
    assert len({r.run_id for r in racing}) == 1 and [r.created for r in racing].count(True) == 1
    for run_id in (first.run_id, racing[0].run_id):
        created = [e for _, e in events_of(await event_log.read(run_id)) if isinstance(e, RunCreated)]
        assert len(created) == 1
    assert sorted(await event_log.list_runs()) == sorted({first.run_id, racing[0].run_id})


async def test_a_start_sent_while_no_executor_runs_is_not_lost(
        infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog) -> None:
    body = encode(StartRun(workflow=parse_workflow({"name": "queued", "steps": [recorded("s")]}),
                           idempotency_key="queued-1"))
    with pytest.raises(CommandTimeout):
        await client.command("start", body, timeout_s=0.3)
    # a second one, whose reply inbox stays open for the answer
    inbox = infra.nc.new_inbox()
    sub = await infra.nc.subscribe(inbox, max_msgs=1)
    body2 = encode(StartRun(workflow=parse_workflow({"name": "queued", "steps": [recorded("s")]}),
                            idempotency_key="queued-2"))
    await infra.js.publish(cfg.names.command("start"), body2, headers={REPLY_TO_HEADER: inbox})
    assert await event_log.list_runs() == []

    async with running(serve, infra, cfg):
        answer = await sub.next_msg(timeout=30)
        for key in ("queued-1", "queued-2"):
            state = await client.wait_for(run_id_for_key(key), ("verifying",), timeout_s=30)
            assert step_status(state, "main", "s") == "succeeded"
    reply = Reply(**json.loads(answer.data))
    assert reply.ok and reply.run_id == run_id_for_key("queued-2") and reply.created
    assert await queued_commands(infra, cfg) == {cfg.names.verify(run_id_for_key(k)): 1
                                                 for k in ("queued-1", "queued-2")}, "acked and gone"


async def queued_commands(infra: Infra, cfg: Config) -> dict[str, int]:
    """Messages left in the commands stream, by subject: with no verifier running, each run that reached
    Verifying leaves its verification trigger there (every command proper was acked and is gone)."""
    return (await infra.js.stream_info(cfg.names.commands_stream, subjects_filter=">")).state.subjects or {}


# ---- takeover and fencing ------------------------------------------------------------------------


class RestingExecutor(Executor):
    """An executor that hands out the state it materialized when a run rests."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rested: dict[str, RunState] = {}
        self.changed = asyncio.Event()

    async def drive(self, run_id: str, state: RunState | None = None) -> RunState | None:
        state = await super().drive(run_id, state)
        if state is not None:
            self.rested[run_id] = state
            self.changed.set()
        return state

    async def rested_state(self, run_id: str, timeout_s: float) -> RunState:
        async def wait() -> RunState:
            while run_id not in self.rested:
                self.changed.clear()
                await self.changed.wait()
            return self.rested[run_id]

        return await asyncio.wait_for(wait(), timeout_s)


@contextlib.asynccontextmanager
async def resting_executor(infra: Infra, cfg: Config) -> AsyncIterator[RestingExecutor]:
    """An in-process executor on the shared durable consumer, with a 2 s redelivery delay."""
    ex = RestingExecutor(infra, cfg, *ports(infra, cfg))
    names = cfg.names
    consumer = CommandConsumer(infra, cfg, "executor", [names.command("start"), names.command("resume")],
                               ex.handle, ack_wait_s=2.0)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        yield ex
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_crashed_executor_is_taken_over_via_redelivery(
        infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path) -> None:
    workflow = {"name": "takeover", "steps": [recorded("a"), scripted_model("b", ["b done"]), recorded("c")]}
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace,
           "REEL_COMMAND_ACK_WAIT_S": "2", "REEL_LEASE_TTL_S": "2", CRASH_ENV: "b:1:after_output",
           "REEL_LOG_FORMAT": "json", "REEL_LOG_LEVEL": "INFO"}
    log_path = tmp_path / "executor.log"
    with log_path.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.executor", env=env, cwd=REPO,
                                                    stderr=stderr)
        try:
            reply = await start(client, workflow, "crash-me")
            assert await asyncio.wait_for(proc.wait(), 60) == 137, log_path.read_text()[-2000:]
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert "executor.crash_injected" in log_path.read_text()
    run_id = reply.run_id
    assert run_id is not None
    crashed = await event_log.load(run_id)
    dead = crashed.executor_id
    b1 = crashed.branches["main"].attempts["b"][0]
    assert (crashed.status, b1.status, b1.executor_id) == ("running", "dispatched", dead)
    stored = await infra.outcomes.get(f"{run_id}.main.b.1")  # output stored, outcome never committed
    assert stored.value

    async with resting_executor(infra, cfg) as ex:  # no new command: only redelivery can wake it
        state = await ex.rested_state(run_id, timeout_s=60)
    assert state.status == "verifying" and ex.executor_id != dead
    view = build_episode_view(state).step("b")
    assert [(a.attempt, a.status, a.superseded, a.executor_id) for a in view.attempts] == [
        (1, "dispatched", True, dead), (2, "succeeded", False, ex.executor_id)]
    commits = await event_log.read(run_id)
    assert [e.executor_id for _, e in events_of(commits) if isinstance(e, RunStarted)] == [dead, ex.executor_id]
    assert_single_writer(commits)
    assert_intents_precede_outcomes(state, commits)
    cold = await assert_refold_identical(event_log, state)  # the executor's materialized state
    assert cold.head_lsn == commits[-1][0]
    assert await queued_commands(infra, cfg) == {cfg.names.verify(run_id): 1}


async def _create_run(infra: Infra, cfg: Config, event_log: JetStreamEventLog, run_id: str,
                      workflow: dict[str, Any]) -> None:
    """A Pending run nobody drives yet (what the executor's start handler commits)."""
    spec = parse_workflow(workflow)
    blobs = JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)
    ref = await blobs.put(encode_workflow(spec), "application/json")
    await event_log.commit(run_id, [RunCreated(run_id=run_id, branch_id="main", workflow_name=spec.name,
                                               workflow_ref=ref, steps=spec.decls(), created_ms=1)],
                           expected_lsn=0, writer="test")


async def test_two_executors_racing_for_runs_never_both_write(
        infra: Infra, cfg: Config, event_log: JetStreamEventLog, tmp_path: Path) -> None:
    xs = [Executor(infra, cfg, *ports(infra, cfg)) for _ in range(3)]
    runs = [f"r-race-{i}" for i in range(6)]
    for run_id in runs:
        effects = tmp_path / f"{run_id}.log"
        side_effect = {"type": "command", "argv": ["sh", "-c", f"echo x >> {effects}"]}
        await _create_run(infra, cfg, event_log, run_id, {"name": "race", "steps": [
            tool("one", side_effect), scripted_model("two", ["2"]), tool("three", side_effect)]})
    results = await asyncio.gather(*(x.drive(r) for r in runs for x in xs))
    assert all(r is not None for r in results)
    for run_id in runs:
        commits = await event_log.read(run_id)
        assert_single_writer(commits)
        state = await event_log.load(run_id)
        assert state.status == "verifying"
        for step in ("one", "two", "three"):
            assert step_status(state, "main", step) == "succeeded"
        intents = [e for _, e in events_of(commits) if isinstance(e, AttemptDispatched) and e.step_id != "two"]
        assert len((tmp_path / f"{run_id}.log").read_text().splitlines()) == len(intents), \
            "every side effect has its own committed intent"
        keys = [(e.step_id, e.attempt) for e in intents]
        assert len(keys) == len(set(keys)), "no attempt was dispatched twice"


async def test_a_live_executor_that_lost_the_run_is_fenced_off(
        infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path) -> None:
    """Executor A is inside a tool call when B claims the run; A's outcome commit is refused: it writes nothing after
    it lost the run.

    Rendezvous, no sleeps: the test follows the run's subject with a core NATS
    subscription (every commit is pushed as it lands), and each tool call blocks
    reading one byte from a FIFO that the test holds open until it lets them go.
    """
    gate, effects = tmp_path / "gate", tmp_path / "effects.log"
    os.mkfifo(gate)
    gate_fd = os.open(gate, os.O_RDWR | os.O_NONBLOCK)  # held open: readers block in read, never in open
    blocked = {"type": "command", "argv": [
        "sh", "-c", f"echo started >> {effects}; dd if={gate} bs=1 count=1 2>/dev/null; echo released"]}
    workflow = {"name": "fence", "steps": [recorded("a"), tool("b", blocked), recorded("c")]}
    run_id = run_id_for_key("fence")
    commits = await infra.nc.subscribe(cfg.names.events(run_id))

    async def until_dispatched(attempt: int) -> None:
        while True:
            msg = await commits.next_msg(timeout=30)
            if any(isinstance(e, AttemptDispatched) and e.step_id == "b" and e.attempt == attempt
                   for e in decode_commit(msg.data).events):
                return

    try:
        async with resting_executor(infra, cfg) as a:
            await start(client, workflow, "fence")
            await until_dispatched(1)  # A is now inside b#1's side effect
            b = Executor(infra, cfg, *ports(infra, cfg))
            taking_over = asyncio.create_task(b.drive(run_id))
            await until_dispatched(2)  # B claimed the run and dispatched b#2
            os.write(gate_fd, b"go")  # one byte for each blocked tool call
            state = await asyncio.wait_for(taking_over, 30)
            await a.rested_state(run_id, timeout_s=30)  # A's drive returned (it yielded)
    finally:
        os.close(gate_fd)
        await commits.unsubscribe()
    assert state is not None and state.status == "verifying"
    state = await event_log.load(run_id)
    log = await event_log.read(run_id)
    assert_single_writer(log)
    assert [e.executor_id for _, e in events_of(log) if isinstance(e, RunStarted)] == [a.executor_id, b.executor_id]
    b_attempts = state.branches["main"].attempts["b"]
    # A lost the run to B's claim: its drive writes nothing after it (b#1's outcome commit is refused, it never
    # re-claims); the step goes on with B's attempt, the one the owner dispatched last. What A writes after the
    # claim is only the end-of-drive resolution of its own superseded b#1 (services/executor/orphans.py): from its
    # marker when its tool had finished before A found the takeover, else executor_lost
    claim_b = next(lsn for lsn, c in log if any(isinstance(e, RunStarted) and e.executor_id == b.executor_id
                                                 for e in c.events))
    late = [c for lsn, c in log if c.writer == a.executor_id and lsn > claim_b]
    assert all((e.step_id, e.attempt) == ("b", 1) and isinstance(e, AttemptSucceeded | AttemptFailed)
               for c in late for e in c.events), late
    assert all(e.recovered for c in late for e in c.events if isinstance(e, AttemptSucceeded)), late
    assert [(x.attempt, x.executor_id) for x in b_attempts] == [(1, a.executor_id), (2, b.executor_id)]
    assert b_attempts[1].status == "succeeded", b_attempts
    assert succeeded_output(state, "main", "b") == b_attempts[1].output_ref
    assert effects.read_text().splitlines() == ["started", "started"]
    await assert_refold_identical(event_log, state)


@contextlib.contextmanager
def info_logs() -> Iterator[list[dict[str, Any]]]:
    """Capture log lines from INFO up (the suite logs WARNING and up), then restore the level."""
    old = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(wrapper_class=old)


async def test_an_outcome_resolved_meanwhile_is_not_recorded_twice(
        infra: Infra, cfg: Config, event_log: JetStreamEventLog, blobs: JetStreamBlobStore, tmp_path: Path) -> None:
    """Recovery resolves b#1 while its tool still runs: the executor's own outcome loses the fence,
    is re-decided on the refreshed state, found recorded already, and the run goes on from there."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    gate_fd = os.open(gate, os.O_RDWR | os.O_NONBLOCK)
    blocked = {"type": "command", "argv": ["sh", "-c", f"dd if={gate} bs=1 count=1 2>/dev/null; echo mine"]}
    run_id = "r-resolved-meanwhile"
    await _create_run(infra, cfg, event_log, run_id, {"name": "resolved", "steps": [
        tool("b", blocked), recorded("c")]})
    commits = await infra.nc.subscribe(cfg.names.events(run_id))
    ex = Executor(infra, cfg, *ports(infra, cfg))
    try:
        with info_logs() as logs:
            driving = asyncio.create_task(ex.drive(run_id))
            while not any(isinstance(e, AttemptDispatched) and e.step_id == "b"
                          for e in decode_commit((await commits.next_msg(timeout=30)).data).events):
                pass
            # b#1 is inside its side effect now; the core subscription can see the commit before the
            # stream's head read does, so the head is read until it holds the dispatch
            while True:
                head = await event_log.head(run_id)
                assert head is not None
                if any(isinstance(e, AttemptDispatched) and e.step_id == "b" for e in head[1].events):
                    break
            theirs = await blobs.put(b"recovered output")
            await event_log.commit(run_id, [AttemptSucceeded(branch_id="main", step_id="b", attempt=1,
                                                             output_ref=theirs, at_ms=1, recovered=True)],
                                   expected_lsn=head[0], writer="recovery")
            os.write(gate_fd, b"g")
            state = await asyncio.wait_for(driving, 30)
    finally:
        os.close(gate_fd)
        await commits.unsubscribe()
    assert state is not None and state.status == "verifying"
    b = state.branches["main"].attempts["b"]
    assert [(a.attempt, a.status, a.recovered, a.output_ref) for a in b] == [(1, "succeeded", True, theirs)]
    log = await event_log.read(run_id)
    outcomes_b = [(c.writer, e) for _, c in log for e in c.events
                  if isinstance(e, AttemptSucceeded | AttemptFailed) and e.step_id == "b"]
    assert [w for w, _ in outcomes_b] == ["recovery"], "the executor's own outcome was not committed on top"
    assert [e["event"] for e in logs if e["event"] in ("executor.conflict", "attempt.outcome_already_recorded")] \
        == ["executor.conflict", "attempt.outcome_already_recorded"]
    assert step_status(state, "main", "c") == "succeeded"
    await assert_refold_identical(event_log, state)


async def test_a_keyed_start_is_the_same_run_when_its_workflow_was_stored_in_another_encoding(
        executor: None, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore) -> None:
    """An older Reel encoded the same workflow with its fields in another order (another sha256): a start with the
    key after an upgrade finds that run, while a start of another workflow with the key is still refused."""
    workflow = {"name": "upgraded", "steps": [recorded("only")]}
    spec = parse_workflow(workflow)
    reordered = json.dumps(json.loads(encode_workflow(spec)), sort_keys=True).encode()
    assert reordered != encode_workflow(spec)
    ref = await blobs.put(reordered, "application/json")
    run_id = run_id_for_key("upgrade-key")
    await event_log.commit(run_id, [RunCreated(
        run_id=run_id, branch_id="main", workflow_name="upgraded", workflow_ref=ref, steps=spec.decls(),
        verifiers=(), idempotency_key="upgrade-key", created_ms=1)], expected_lsn=0, writer="older-reel")
    again = await start(client, workflow, "upgrade-key")
    assert (again.ok, again.run_id, again.created) == (True, run_id, False), again
    other = await client.start(parse_workflow({"name": "other", "steps": [recorded("x")]}),
                               idempotency_key="upgrade-key")
    assert not other.ok and other.error is not None and other.error.code == "idempotency_conflict", other
