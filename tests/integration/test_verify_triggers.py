"""Verifiers get triggers, not the firehose: one ``VerifyRun`` per run entering Verifying,
and no verdict lost when the executor dies between the ``run_verifying`` commit and the trigger."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from nats.js.errors import NotFoundError

from reel.services.executor.attempts import CRASH_ENV
from reel.services.recovery.app import serve as recovery_serve
from reel.services.recovery.index import IntentIndex
from reel.services.verifier.app import serve as verifier_serve
from reel.shared.core.run.events import Commit, RunCompleted, VerdictRecorded, encode_commit
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running
from tests.integration.scenarios import wait_until

STEPS = 12


def _workflow(name: str) -> dict[str, object]:
    return {"name": name,
            "steps": [{"kind": "tool", "id": f"s{i}", "tool": {"type": "recorded", "output": f"out {i}"}}
                      for i in range(STEPS)],
            "verifiers": [{"type": "output_regex", "name": "last", "pattern": f"out {STEPS - 1}"}]}


async def _delivered_to_verifier(infra: Infra, cfg: Config) -> int:
    info = await infra.js.consumer_info(cfg.names.commands_stream, cfg.names.consumer("verifier"))
    return info.delivered.consumer_seq


async def test_a_verifier_receives_one_message_per_run(executor: None, infra: Infra, cfg: Config,
                                                       client: ReelClient) -> None:
    async with running(verifier_serve, infra, cfg):
        replies = await asyncio.gather(*(client.start(parse_workflow(_workflow(f"t{i}"))) for i in range(3)))
        for reply in replies:
            assert reply.ok and reply.run_id, reply
            state = await client.wait_for(reply.run_id, ("completed",), timeout_s=30)
            assert state.outcome == "passed" and state.commits > STEPS  # a commit per step and more...
        assert await _delivered_to_verifier(infra, cfg) == 3  # ...one message each to the verifier
    consumers = [c.name for c in await infra.js.consumers_info(cfg.names.events_stream)]
    assert cfg.names.consumer("verifier") not in consumers  # no durable on the event stream


async def test_no_verdict_lost_when_the_executor_dies_before_the_trigger(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path
) -> None:
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace,
           "REEL_LEASE_TTL_S": str(cfg.lease_ttl_s), "REEL_LOG_FORMAT": "json", CRASH_ENV: "verifying:after_commit",
           "REEL_COMMAND_ACK_WAIT_S": "120"}  # the dead executor's start command must not come back mid-test
    log_path = tmp_path / "executor.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.executor", cwd=REPO, env=env,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
    try:
        reply = await client.start(parse_workflow(_workflow("crash-before-trigger")))
        assert reply.ok and reply.run_id, reply
        code = await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 137, f"executor exited {code}: {log_path.read_text()[-3000:]}"
    run_id = reply.run_id
    state = await event_log.load(run_id)
    assert state.status == "verifying" and state.verifying_lsn == state.head_lsn
    with pytest.raises(NotFoundError):  # the commit landed, the trigger never did
        await infra.js.get_last_msg(cfg.names.commands_stream, cfg.names.verify(run_id))

    async with running(verifier_serve, infra, cfg), running(recovery_serve, infra, cfg, sweep_interval_s=0.2):
        done = await client.wait_for(run_id, ("completed",), timeout_s=30)
        # the re-triggered job acked its trigger: nothing is left queued, and later sweeps add nothing
        await wait_until(lambda: _no_trigger(infra, cfg, run_id), timeout_s=10, what="the trigger to be acked")
    commits = await event_log.read(run_id)
    verdicts = [e.verdict for _, c in commits for e in c.events if isinstance(e, VerdictRecorded)]
    assert [(v.verifier, v.status, v.snapshot_lsn) for v in verdicts] == [("last", "pass", state.verifying_lsn)]
    assert done.outcome == "passed"
    assert sum(isinstance(e, RunCompleted) for _, c in commits for e in c.events) == 1
    assert await _delivered_to_verifier(infra, cfg) == 1


async def _no_trigger(infra: Infra, cfg: Config, run_id: str) -> bool:
    try:
        await infra.js.get_last_msg(cfg.names.commands_stream, cfg.names.verify(run_id))
    except NotFoundError:
        return True
    return False


async def test_the_index_keeps_runs_resting_in_verifying_until_they_leave(
    executor: None, client: ReelClient, cfg: Config, event_log: JetStreamEventLog
) -> None:
    reply = await client.start(parse_workflow(_workflow("indexed")))
    assert reply.ok and reply.run_id, reply
    state = await client.wait_for(reply.run_id, ("verifying",), timeout_s=30)
    index = IntentIndex(cfg.names.events(""))
    for lsn, commit in await event_log.read(state.run_id):
        index.observe(state.run_id, lsn, encode_commit(commit))
    assert index.verifying == {state.run_id: state.verifying_lsn}
    assert state.run_id not in index.states  # forgotten (resting, no open intent), yet still watched
    done = Commit(commit_id="c-done", run_id=state.run_id, writer="v",
                  events=(RunCompleted(branch_id="main", outcome="passed", at_ms=1),))
    index.observe(state.run_id, state.head_lsn + 1, encode_commit(done))
    assert index.verifying == {}
