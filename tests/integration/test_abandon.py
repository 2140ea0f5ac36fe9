"""A live executor's superseded attempt is resolved by that executor, on a real nats-server.

The stuck path: an executor's drive raises between an intent and its outcome (the command is nak'ed).
Its lease lives on, so recovery never resolves that attempt (``waiting: executor_alive``), and the
drive that comes next supersedes it — this executor's own next drive (the run is still its own), or
another executor's — so nothing ever records it. The logs here are the ones such a drive leaves.
"""

from __future__ import annotations

import asyncio

from reel.services.executor.app import ports
from reel.services.executor.app import serve as executor_serve
from reel.services.executor.handler import Executor
from reel.services.recovery.app import serve as recovery_serve
from reel.shared.core.errors import BlobMissing
from reel.shared.core.mutators.recovery import EXECUTOR_LOST
from reel.shared.core.run.events import AttemptDispatched, AttemptSucceeded, RunCreated, RunStarted, RunVerifying
from reel.shared.core.run.ids import ROOT_BRANCH
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.nats.publish import publish_resume
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import attempt_of, commit_events, create_manual_run, head_lsn, wait_state
from tests.integration.test_recovery import heartbeating, recover
from tests.refold import assert_refold_identical

ME = "x-abandons"
OTHER = "x-took-over"


async def test_an_executors_next_drive_resolves_the_attempt_its_raising_drive_left(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,
) -> None:
    spec = parse_workflow({"name": "abandon", "steps": [
        {"kind": "tool", "id": "a", "max_attempts": 2, "tool": {"type": "scripted", "outputs": ["out of a"]}},
        {"kind": "tool", "id": "b", "tool": {"type": "scripted", "outputs": ["out of b"]}}]})
    ref = await blobs.put(encode_workflow(spec), "application/json")
    run = "r-abandoned-by-its-own-next-drive"
    await event_log.commit(run, [RunCreated(run_id=run, branch_id=ROOT_BRANCH, workflow_name=spec.name,
                                            workflow_ref=ref, steps=spec.decls(), created_ms=0)],
                           expected_lsn=0, writer=ME)
    # what ME's drive committed before it raised: the claim with a#1's intent (the command was nak'ed)
    await commit_events(event_log, run, RunStarted(executor_id=ME, at_ms=1),
                        AttemptDispatched(branch_id="main", step_id="a", attempt=1, executor_id=ME, at_ms=1), writer=ME)

    async with running(executor_serve, infra, cfg, executor_id=ME):  # ME lives on (its lease) and drives it again
        await publish_resume(infra.js, cfg.names, run, await head_lsn(event_log, run))
        state = await wait_state(event_log, run, lambda s: s.status == "verifying" and not any(
            a.status == "dispatched" for atts in s.branches["main"].attempts.values() for a in atts),
            what="the run to rest in verifying with no attempt left dispatched")
        async with running(recovery_serve, infra, cfg, sweep=False):
            detail = await recover(client, run)
    assert detail["waiting"] == [] and detail["resolved"] == []  # nothing left for recovery: never stuck
    a1, a2 = attempt_of(state, "a", 1), attempt_of(state, "a", 2)
    assert (a1.status, a1.error_kind, a1.recovered) == ("failed", EXECUTOR_LOST, True)
    assert f"{ME} abandoned it" in (a1.error_message or "")
    assert (a2.status, a2.executor_id) == ("succeeded", ME)  # superseded by its own next drive, not a try
    assert attempt_of(state, "b", 1).status == "succeeded"
    await assert_refold_identical(event_log, state)


async def test_a_raising_drive_leaves_the_attempt_to_be_resolved_once_another_executor_superseded_it(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog,
) -> None:
    run = "r-abandoned-after-a-takeover"
    await create_manual_run(event_log, run, [("a", 3)])  # its workflow blob is missing: every drive raises
    await commit_events(event_log, run, RunStarted(executor_id=ME, at_ms=1),
                        AttemptDispatched(branch_id="main", step_id="a", attempt=1, executor_id=ME, at_ms=1), writer=ME)
    # ME's lease lapsed for a moment (a server outage): OTHER took the run over and finished the step
    await commit_events(event_log, run, RunStarted(executor_id=OTHER, at_ms=2),
                        AttemptDispatched(branch_id="main", step_id="a", attempt=2, executor_id=OTHER, at_ms=2))
    out = await JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket).put(b"out of a")
    await commit_events(event_log, run, AttemptSucceeded(branch_id="main", step_id="a", attempt=2, output_ref=out,
                                                         at_ms=3), RunVerifying(branch_id="main", at_ms=3))

    async with heartbeating(infra, ME), running(recovery_serve, infra, cfg, sweep=False):
        detail = await recover(client, run)  # ME is alive: recovery leaves its attempt alone
        assert [(w["attempt"], w["reason"]) for w in detail["waiting"]] == [(1, "executor_alive")]  # type: ignore

        ex = Executor(infra, cfg, *ports(infra, cfg), executor_id=ME)
        try:
            try:
                await ex._drive_until_rest(run, "resume")  # the drive raises (here: its workflow is missing)
            except BlobMissing:
                pass
            else:
                raise AssertionError("the drive was expected to raise")
            assert ex.orphans.crashed == {run}
            stop = asyncio.Event()
            tending = asyncio.create_task(ex.orphans.tend_loop(lambda: ex.driving, stop, 0.2))
            try:
                state = await wait_state(event_log, run, lambda s: attempt_of(s, "a", 1).status != "dispatched",
                                         timeout_s=10, what="ME to resolve the attempt its raising drive left")
            finally:
                stop.set()
                await tending
        finally:
            await ex.control.stop()
        assert ex.orphans.crashed == set()  # none of ME's intents is open in it any more: forgotten
        detail = await recover(client, run)
    a1 = attempt_of(state, "a", 1)
    assert (a1.status, a1.error_kind, a1.recovered) == ("failed", EXECUTOR_LOST, True)
    assert detail["waiting"] == [] and state.status == "verifying"
    await assert_refold_identical(event_log, state)
