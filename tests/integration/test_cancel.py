"""Cancel service on a real nats-server: every legal source state, no-op answers, a live executor, bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path

from reel.services.cancel.app import serve as cancel_serve
from reel.services.executor.app import serve as executor_serve
from reel.shared.core.run.events import RunCancelled, RunCompleted, RunVerifying
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import attempt_of, commit_events, create_manual_run, head_lsn, wait_until
from tests.refold import assert_refold_identical


async def test_cancel_stops_an_executor_driving_the_run(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path
) -> None:
    started, gate = tmp_path / "started", tmp_path / "gate"
    spec = parse_workflow({"name": "gated", "steps": [
        {"kind": "tool", "id": "slow", "tool": {"type": "command", "argv": [
            "sh", "-c", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done; echo slow-done"]}},
        {"kind": "tool", "id": "next", "tool": {"type": "scripted", "outputs": ["never"]}},
    ]})
    async with running(executor_serve, infra, cfg), running(cancel_serve, infra, cfg):
        start = await client.start(spec)
        assert start.run_id
        run = start.run_id
        await wait_until(lambda: _exists(started), timeout_s=30, what="the slow tool to start")
        reply = await client.cancel(run, "user pressed stop")
        assert reply.ok and reply.status == "cancelled" and reply.lsn > 0, reply
        gate.touch()  # too late: the executor killed the tool's group when the cancel's signal came

        async def executor_done() -> bool:  # the executor acks the start command once drive() returns
            info = await infra.js.consumer_info(cfg.names.commands_stream, cfg.names.consumer("executor"))
            return info.num_ack_pending == 0 and info.num_pending == 0

        await wait_until(executor_done, timeout_s=30, what="the executor to stop driving the run")
    state = await event_log.load(run)
    assert state.status == "cancelled" and state.cancel_reason == "user pressed stop"
    # the attempt in flight was stopped and recorded cancelled, on top of the cancel, and nothing more
    # (it was once recorded succeeded after the cancel; tests/integration/test_cancel_in_flight.py)
    slow = attempt_of(state, "slow", 1)
    assert (slow.status, slow.outcome_lsn, slow.output_ref) == ("cancelled", reply.lsn + 1, None)
    assert state.head_lsn == reply.lsn + 1, "the executor committed more than the outcome after the cancel"
    assert "next" not in state.branches["main"].attempts  # it never went on to the next step
    await assert_refold_identical(event_log, state)


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def test_cancel_is_legal_from_pending_and_verifying(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    spec = parse_workflow({"name": "quick", "steps": [
        {"kind": "tool", "id": "only", "tool": {"type": "scripted", "outputs": ["done"]}}]})
    await create_manual_run(event_log, "r-pending", [("only", 1)])
    async with running(executor_serve, infra, cfg), running(cancel_serve, infra, cfg):
        start = await client.start(spec)
        assert start.run_id
        verifying = await client.wait_for(start.run_id, ("verifying",), timeout_s=30)
        for run, was in (("r-pending", "pending"), (start.run_id, "verifying")):
            before = await head_lsn(event_log, run)
            reply = await client.cancel(run, "enough")
            assert reply.ok and reply.status == "cancelled" and reply.lsn > before, reply
            assert reply.detail == {"previous_status": was}
            state = await event_log.load(run)
            assert state.status == "cancelled" and state.head_lsn == reply.lsn
            commit = (await event_log.head(run))
            assert commit is not None and commit[1].writer == "cancel"
            assert isinstance(commit[1].events[0], RunCancelled)
    # a verifier's pinned view is untouched: the cancel is a commit above the Verifying LSN
    pinned = await event_log.load(start.run_id, upto_lsn=verifying.verifying_lsn)
    assert pinned.status == "verifying" and pinned.head_lsn == verifying.head_lsn


async def test_cancelling_an_ended_run_is_a_clear_no_op(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    await create_manual_run(event_log, "r-done", [("s", 1)])
    await commit_events(event_log, "r-done", RunVerifying(branch_id="main", at_ms=1))
    await commit_events(event_log, "r-done", RunCompleted(branch_id="main", outcome="passed", at_ms=2))
    await create_manual_run(event_log, "r-gone", [("s", 1)])
    await commit_events(event_log, "r-gone", RunCancelled(reason="first", at_ms=1))
    async with running(cancel_serve, infra, cfg):
        for run, status in (("r-done", "completed"), ("r-gone", "cancelled")):
            before = await head_lsn(event_log, run)
            reply = await client.cancel(run)
            assert reply.ok and reply.status == status and reply.lsn == 0, reply
            assert reply.detail == {"noop": True, "reason": f"run is already {status}"}
            assert await head_lsn(event_log, run) == before
    assert (await event_log.load("r-gone")).cancel_reason == "first"


BAD_CANCEL = [
    (b"{not json", "invalid_command"),
    (b"", "invalid_command"),
    (b'"r-victim"', "invalid_command"),
    (b"{}", "invalid_command"),
    (b'{"run_id": 7}', "invalid_command"),
    (b'{"run_id": "r-victim", "reason": ["x"]}', "invalid_command"),
    (b'{"run_id": "r-victim", "force": true}', "invalid_command"),
    (b'{"run_id": "reel.ev.>"}', "invalid_command"),
    (b'{"run_id": "r-victim*"}', "invalid_command"),
    (b'{"run_id": "r-never-existed"}', "run_not_found"),
]


async def test_cancel_bad_input_is_refused_without_a_commit(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    before = await create_manual_run(event_log, "r-victim", [("s", 1)])
    async with running(cancel_serve, infra, cfg):
        for body, code in BAD_CANCEL:
            reply = await client.command("cancel", body, timeout_s=15)
            assert not reply.ok and reply.error is not None, (body, reply)
            assert reply.error.code == code and reply.error.message, (body, reply)
            assert await head_lsn(event_log, "r-victim") == before, body
        reply = await client.cancel("r-victim")  # still up; a valid cancel works
    assert reply.ok and reply.status == "cancelled" and reply.lsn > before
