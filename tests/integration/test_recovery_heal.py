"""Recovery heals drivable runs nobody drives (self-healing, not only open intents).

A run in ``pending`` (its start was acked, the drive lost: the R3 stuck-start bug) or in
``running`` with no open intent whose owner has no lease gets one ``ResumeRun`` from the
sweep, and an executor drives it to rest. A run whose owner holds a lease is left alone.
"""

from __future__ import annotations

from reel.services.executor.app import serve as executor_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.shared.core.run.events import RunCreated, RunStarted
from reel.shared.core.run.ids import ROOT_BRANCH, ExecutorId, RunId
from reel.shared.core.workflow.spec import encode_workflow, parse_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import wait_state
from tests.integration.test_recovery import heartbeating

SPEC = parse_workflow({"name": "heal", "steps": [
    {"kind": "tool", "id": "a", "tool": {"type": "scripted", "outputs": ["one"]}},
    {"kind": "tool", "id": "b", "tool": {"type": "scripted", "outputs": ["two"]}}]})


async def _orphan(event_log: JetStreamEventLog, blobs: JetStreamBlobStore, run_id: str,
                  owner: str | None) -> int:
    """A run created (and claimed by ``owner``) with no command queued for it; its head LSN."""
    ref = await blobs.put(encode_workflow(SPEC), "application/json")
    created = RunCreated(run_id=RunId(run_id), branch_id=ROOT_BRANCH, workflow_name=SPEC.name, workflow_ref=ref,
                         steps=SPEC.decls(), created_ms=0)
    lsn = await event_log.commit(run_id, [created], expected_lsn=0, writer="test")
    if owner is not None:
        lsn = await event_log.commit(run_id, [RunStarted(executor_id=ExecutorId(owner), at_ms=0)],
                                     expected_lsn=lsn, writer=owner)
    return lsn


async def test_recovery_resumes_pending_and_ownerless_running_runs(
        infra: Infra, cfg: Config, event_log: JetStreamEventLog, blobs: JetStreamBlobStore) -> None:
    await _orphan(event_log, blobs, "pending-lost", None)
    await _orphan(event_log, blobs, "running-lost", "x-dead00000000")
    async with running(executor_serve, infra, cfg), running(recovery_serve, infra, cfg, sweep_interval_s=0.2):
        for run_id in ("pending-lost", "running-lost"):
            state = await wait_state(event_log, run_id, lambda s: s.status == "verifying", timeout_s=30,
                                     what=f"{run_id} driven to verifying")
            assert [a.status for b in state.branches.values() for atts in b.attempts.values() for a in atts] == [
                "succeeded", "succeeded"]


async def test_recovery_leaves_a_run_whose_owner_is_alive(
        infra: Infra, cfg: Config, event_log: JetStreamEventLog, blobs: JetStreamBlobStore) -> None:
    owner = "x-alive0000000"
    async with heartbeating(infra, owner):
        lsn = await _orphan(event_log, blobs, "owned", owner)
        async with running(executor_serve, infra, cfg), running(recovery_serve, infra, cfg, sweep_interval_s=0.2):
            await _orphan(event_log, blobs, "witness", None)  # healed by the same sweeps, which saw the owned run
            await wait_state(event_log, "witness", lambda s: s.status == "verifying", timeout_s=30, what="witness")
    head = await event_log.head("owned")
    assert head is not None and head[0] == lsn, "a run with a live owner is not taken over"
