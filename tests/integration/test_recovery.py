"""Recovery service on a real nats-server: lost intents, leases, resume, inherited intents, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from reel.services.executor.app import serve as executor_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.shared.core.mutators.recovery import EXECUTOR_LOST
from reel.shared.core.run.events import AttemptDispatched, AttemptSucceeded, RunStarted, RunVerifying
from reel.shared.core.run.views import build_episode_view, serialize_view
from reel.shared.core.wire.commands import RecoverRuns, encode
from reel.shared.core.wire.subjects import outcome_key
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import (
    LOST_OUTPUT,
    STEP,
    attempt_of,
    commit_events,
    crash_executor_mid_attempt,
    crashed_attempt_scenario,
    create_manual_run,
    head_lsn,
    wait_state,
)
from tests.refold import assert_refold_identical


async def recover(client: ReelClient, run_id: str | None = None) -> dict[str, object]:
    reply = await client.command("recover", encode(RecoverRuns(run_id=run_id)), timeout_s=15)
    assert reply.ok, reply
    return reply.detail


async def test_recovery_resolves_lost_attempt_above_the_verifying_lsn(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore
) -> None:
    crash = await crashed_attempt_scenario(infra, cfg, client)
    pinned = await event_log.load(crash.run_id, upto_lsn=crash.verifying_lsn)
    held = serialize_view(build_episode_view(pinned))

    async with running(recovery_serve, infra, cfg, sweep=False):
        detail = await recover(client, crash.run_id)

    assert [(r["step"], r["attempt"], r["outcome"]) for r in detail["resolved"]] == [  # type: ignore[attr-defined]
        (STEP, crash.lost_attempt, "succeeded")]
    state = await event_log.load(crash.run_id)
    lost = attempt_of(state, STEP, crash.lost_attempt)
    assert lost.status == "succeeded" and lost.recovered
    assert lost.outcome_lsn is not None and lost.outcome_lsn > crash.verifying_lsn
    assert lost.output_ref == crash.lost_output_ref
    assert (await blobs.get_text(crash.lost_output_ref)) == LOST_OUTPUT
    assert state.status == "verifying" and state.verifying_lsn == crash.verifying_lsn  # run state not moved

    fresh = build_episode_view(await event_log.load(crash.run_id, cold=True))
    fresh_lost = fresh.step(STEP).attempts[crash.lost_attempt - 1]
    assert fresh_lost.status == "succeeded" and fresh_lost.recovered
    at_snapshot = build_episode_view(await event_log.load(crash.run_id, upto_lsn=crash.verifying_lsn, cold=True))
    assert at_snapshot.step(STEP).attempts[crash.lost_attempt - 1].status == "dispatched"
    assert serialize_view(at_snapshot) == held
    assert at_snapshot.failed_attempts == 1 and len(at_snapshot.step(STEP).attempts) == 3
    await assert_refold_identical(event_log, state)

    async with running(recovery_serve, infra, cfg, sweep=False):  # a second pass finds nothing left
        again = await recover(client, crash.run_id)
    assert again["resolved"] == [] and await head_lsn(event_log, crash.run_id) == state.head_lsn


async def test_recovery_resumes_a_live_run_then_resolves_the_superseded_attempt(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    run_id, dead = await crash_executor_mid_attempt(infra, cfg, client)
    before = await head_lsn(event_log, run_id)
    async with running(recovery_serve, infra, cfg, sweep=False):
        # nobody drives the run: recovery must not resolve its latest intent, it asks for a resume
        detail = await recover(client, run_id)
        assert detail["resolved"] == [] and detail["resumed"] == [run_id]
        assert [(w["attempt"], w["reason"]) for w in detail["waiting"]] == [(2, "latest_attempt")]  # type: ignore
        assert await head_lsn(event_log, run_id) == before

        async with running(executor_serve, infra, cfg):  # the published ResumeRun is waiting for it
            state = await wait_state(event_log, run_id, lambda s: s.status == "verifying",
                                     what="the resumed run to reach verifying")
        assert attempt_of(state, STEP, 2).status == "dispatched" and attempt_of(state, STEP, 3).status == "succeeded"
        assert attempt_of(state, STEP, 3).executor_id != dead

        detail = await recover(client, run_id)
    assert [(r["attempt"], r["outcome"]) for r in detail["resolved"]] == [(2, "succeeded")]  # type: ignore
    final = await event_log.load(run_id)
    assert attempt_of(final, STEP, 2).outcome_lsn == final.head_lsn > state.head_lsn


@contextlib.asynccontextmanager
async def heartbeating(infra: Infra, executor_id: str) -> AsyncIterator[None]:
    """Hold a live lease for ``executor_id`` (as a live executor does) for the duration of the block."""
    stop = asyncio.Event()
    body = json.dumps({"executor_id": executor_id}).encode()

    async def beat() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.3)
            await infra.leases.put(executor_id, body)

    await infra.leases.put(executor_id, body)  # live before the block starts
    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        stop.set()
        await task
        await infra.leases.delete(executor_id)


async def test_recovery_never_touches_a_live_executors_intent(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    run = "r-live-lease"
    await create_manual_run(event_log, run, [("s", 3)])
    await commit_events(event_log, run, RunStarted(executor_id="x-other", at_ms=1))
    await commit_events(event_log, run, AttemptDispatched(branch_id="main", step_id="s", attempt=1,
                                                          executor_id="x-live", at_ms=2))
    await commit_events(event_log, run, AttemptDispatched(branch_id="main", step_id="s", attempt=2,
                                                          executor_id="x-dead", at_ms=3))
    stored = await JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket).put(b"stored by x-dead")
    await infra.outcomes.put(outcome_key(run, "main", "s", 2), encode(stored))
    await commit_events(event_log, run, AttemptDispatched(branch_id="main", step_id="s", attempt=3,
                                                          executor_id="x-other", at_ms=4))
    await commit_events(event_log, run, AttemptSucceeded(branch_id="main", step_id="s", attempt=3,
                                                         output_ref=stored, at_ms=5))
    verifying = await commit_events(event_log, run, RunVerifying(branch_id="main", at_ms=6))

    async with heartbeating(infra, "x-live"), running(recovery_serve, infra, cfg, sweep_interval_s=0.3):
        detail = await recover(client)  # a scan of every run, after the index caught up
        assert {(w["run"], w["attempt"], w["reason"]) for w in detail["waiting"]} == {  # type: ignore
            (run, 1, "executor_alive")}
        state = await event_log.load(run)
        assert attempt_of(state, "s", 1).status == "dispatched"  # x-live holds its lease: untouched
        s2 = attempt_of(state, "s", 2)  # x-dead's marker: resolved with the stored output
        assert (s2.status, s2.recovered, s2.output_ref) == ("succeeded", True, stored)
        assert s2.outcome_lsn == state.head_lsn > verifying

    # the lease is gone (deleted by `heartbeating`); the periodic sweep resolves attempt 1 with no command
    async with running(recovery_serve, infra, cfg, sweep_interval_s=0.3):
        final = await wait_state(event_log, run, lambda s: attempt_of(s, "s", 1).status != "dispatched",
                                 timeout_s=10, what="the sweep to resolve attempt 1 once x-live's lease is gone")
    s1 = attempt_of(final, "s", 1)
    assert (s1.status, s1.error_kind, s1.recovered) == ("failed", EXECUTOR_LOST, True)
    assert final.status == "verifying"
    await assert_refold_identical(event_log, final)


async def test_recovery_resolves_an_intent_inherited_by_a_fork_from_its_origin(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    spec = parse_workflow({"name": "inherit", "steps": [
        {"kind": "tool", "id": "a", "tool": {"type": "scripted", "outputs": ["A"]}},
        {"kind": "tool", "id": "b", "tool": {"type": "scripted", "outputs": ["B1", "B2"]}},
        {"kind": "tool", "id": "c", "tool": {"type": "scripted", "outputs": ["C"]}},
    ]})
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg), \
            running(recovery_serve, infra, cfg, sweep=False):
        start = await client.start(spec)
        assert start.run_id
        main = await client.wait_for(start.run_id, ("verifying",), timeout_s=30)
        b1 = attempt_of(main, "b", 1)
        # fork at b#1's intent: on the new branch b#1 is in flight (its outcome came later)
        reply = await client.rewind(start.run_id, at_lsn=b1.dispatched_lsn, idempotency_key="mid-b")
        assert reply.ok and reply.branch_id
        new = reply.branch_id
        state = await wait_state(event_log, start.run_id,
                                 lambda s: s.status == "verifying" and s.verifying_branch == new)
        assert attempt_of(state, "b", 1, new).status == "dispatched"  # inherited copy, superseded by b#2
        assert attempt_of(state, "b", 2, new).status == "succeeded"
        detail = await recover(client, start.run_id)
    # its executor is alive, but it never writes on this branch: resolved from main's own outcome
    assert [(r["branch"], r["step"], r["attempt"], r["outcome"]) for r in detail["resolved"]] == [  # type: ignore
        (new, "b", 1, "succeeded")]
    final = await event_log.load(start.run_id)
    copy = attempt_of(final, "b", 1, new)
    assert copy.recovered and copy.output_ref == b1.output_ref
    assert final.branches["main"] == main.branches["main"]  # the parent's records never change


BAD_RECOVER = [
    (b"{not json", "invalid_command"),
    (b"", "invalid_command"),
    (b"[]", "invalid_command"),
    (b'{"run_id": 42}', "invalid_command"),
    (b'{"run_id": "r-x", "all": true}', "invalid_command"),
    (b'{"run_id": "r.*"}', "invalid_command"),
    (b'{"run_id": "r-never-existed"}', "run_not_found"),
]


async def test_recover_bad_input_is_refused_without_a_commit(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    run = "r-bystander"
    await create_manual_run(event_log, run, [("s", 1)])
    await commit_events(event_log, run, AttemptDispatched(branch_id="main", step_id="s", attempt=1,
                                                          executor_id="x-gone", at_ms=1))
    await commit_events(event_log, run, AttemptDispatched(branch_id="main", step_id="s", attempt=2,
                                                          executor_id="x-gone", at_ms=2))
    before = await head_lsn(event_log, run)
    async with running(recovery_serve, infra, cfg, sweep=False):
        for body, code in BAD_RECOVER:
            reply = await client.command("recover", body, timeout_s=15)
            assert not reply.ok and reply.error is not None, (body, reply)
            assert reply.error.code == code and reply.error.message, (body, reply)
            assert await head_lsn(event_log, run) == before, body
        detail = await recover(client, run)  # the service is still up and a valid command works
    assert [(r["attempt"], r["outcome"]) for r in detail["resolved"]] == [(1, "failed")]  # type: ignore
