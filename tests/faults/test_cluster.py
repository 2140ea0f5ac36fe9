"""Reel on a 3-node loopback JetStream cluster at R3.

Three real nats-server processes (tests/support/cluster.py). The scenarios:

* reads that must see a write see it: a run read right after its commit, over and over, never
  comes back shorter than what was acked (a follower's Direct Get may lag);
* a commit loop through a kill -9 of the events stream's leader: every commit is acked once, at
  one LSN, nothing twice (a publish in flight is re-sent with its Nats-Msg-Id until it settles);
* a command published while the commands stream elects a leader is queued once (the client
  re-sends it with its Nats-Msg-Id), a missing commands stream is an error at once, and
  ``ensure_infra`` at a service's start waits out a cluster without quorum;
* 200 runs of two command tools (real service processes: two executors, recovery, a verifier)
  while the events-stream leader is killed and restarted and an executor is killed: every acked
  start completes exactly once, nothing stuck, no side effect without its attempt, refold identical.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from reel.shared.core.errors import ReelError
from reel.shared.core.run.events import BlobRef, RunCreated
from reel.shared.core.run.ids import ROOT_BRANCH, RunId
from reel.shared.core.wire.commands import RecoverRuns, encode
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import CommandTimeout, ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra, connect, ensure_infra, ensure_infra_retrying
from reel.shared.nats.subjectlog import SubjectLog
from reel.shared.runtime.config import Config
from tests.faults.checks import check_runs
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import ServiceProcs
from tests.faults.scenario import ACK_WAIT_S, effects_workflow, record, start_all
from tests.integration.scenarios import wait_until
from tests.support.cluster import Cluster, cluster

pytestmark = pytest.mark.faults

RUNS = 200


@pytest.fixture(scope="module")
async def r3(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    """A 3-node cluster for this module (its stores and logs under a temp dir)."""
    async with cluster(workdir=tmp_path_factory.mktemp("cluster")) as c:
        yield c


def r3_cfg(c: Cluster) -> Config:
    """A fresh namespace on the cluster at R3, with the fault suite's short timings."""
    return Config(nats_url=c.urls, names=Names(f"t{uuid.uuid4().hex[:10]}"), replicas=3, lease_ttl_s=2,
                  command_ack_wait_s=ACK_WAIT_S)


@pytest.fixture
async def r3_infra(r3: Cluster) -> AsyncIterator[Infra]:
    """The namespace's streams and buckets at R3, on a connection to every node; set up as a service does
    (retried while the cluster forms or re-forms after a test restarted nodes: 10005 "no suitable peers")."""
    cfg = r3_cfg(r3)
    nc = await connect(cfg, name="reel-tests-r3")
    try:
        infra = await ensure_infra_retrying(nc, cfg, within_s=60)
        infra.cfg = cfg  # type: ignore[attr-defined]
        yield infra
    finally:
        await nc.close()


def _created(run_id: str) -> RunCreated:
    return RunCreated(run_id=RunId(run_id), branch_id=ROOT_BRANCH, workflow_name="r3", steps=(),
                      workflow_ref=BlobRef(sha256="0" * 64, size_bytes=0, media_type="application/json"),
                      created_ms=0)


async def test_a_read_after_an_acked_commit_sees_it(r3_infra: Infra) -> None:
    cfg: Config = r3_infra.cfg  # type: ignore[attr-defined]
    writer = JetStreamEventLog(r3_infra.nc, cfg.names)
    short = []
    for i in range(300):
        run_id = f"raw{i}"
        lsn = await writer.commit(run_id, [_created(run_id)], expected_lsn=0, writer="t")
        head = await writer.head(run_id)
        commits = await writer.read(run_id)
        if head is None or head[0] != lsn or [c[0] for c in commits] != [lsn]:
            short.append(run_id)
    assert not short, f"{len(short)} of 300 reads right after an acked commit did not see it"


async def test_commits_through_a_leader_kill_land_once(r3: Cluster, r3_infra: Infra) -> None:
    cfg: Config = r3_infra.cfg  # type: ignore[attr-defined]
    log = SubjectLog(r3_infra.nc, cfg.names.events_stream, cfg.names.events)
    key, acked, latencies = "through-kill", [0], []
    killed: str | None = None
    for i in range(120):
        if i == 20:
            killed = await r3.kill_stream_leader(cfg.names.events_stream)
        t0 = time.monotonic()
        acked.append(await log.append(key, f"c{i}".encode(), expected_seq=acked[-1]))
        latencies.append(time.monotonic() - t0)
    assert killed is not None
    await r3.restart(killed)
    await r3.wait_stream_current(cfg.names.events_stream)
    stored = await log.read_raw(key)
    assert [seq for seq, _ in stored] == acked[1:], "every acked commit once, in order, nothing else"
    assert [body for _, body in stored] == [f"c{i}".encode() for i in range(120)]
    assert max(latencies) > 1.0, "the kill stalled writes (else it did not hit the leader)"


async def test_200_runs_through_a_leader_kill_and_an_executor_kill(
        r3: Cluster, r3_infra: Infra, tmp_path: Path, faults_ledger: FaultsLedger) -> None:
    cfg: Config = r3_infra.cfg  # type: ignore[attr-defined]
    blobs = JetStreamBlobStore(r3_infra.nc, r3_infra.blobs, cfg.names.blob_bucket)
    client = ReelClient(r3_infra.nc, cfg, blobs)
    effects = tmp_path / "effects.txt"
    async with ServiceProcs(cfg, tmp_path) as procs:
        for service in ("verifier", "recovery", "executor", "executor"):
            await procs.start(service)
        victim = procs.procs[-1]
        specs = [effects_workflow(effects, f"r3-{i}", steps=("s1", "s2")) for i in range(RUNS)]
        started = asyncio.ensure_future(start_all(client, specs, keys=[f"r3-{i}" for i in range(RUNS)],
                                                  timeout_s=120))

        def effects_seen(n: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return effects.exists() and len(effects.read_text().splitlines()) >= n
            return check

        await wait_until(effects_seen(40), timeout_s=120, what="40 side effects")
        leader = await r3.kill_stream_leader(cfg.names.events_stream)
        await wait_until(effects_seen(120), timeout_s=120, what="120 side effects")
        await procs.kill(victim)
        await r3.restart(leader)
        await procs.start("executor")
        run_ids = [r.run_id for r in await started if r.run_id]
        assert len(run_ids) == RUNS
        counts = await check_runs(client.log, run_ids, side_effects=effects, timeout_s=150)
        if counts.problems:
            counts.problems.append(procs.logs())
    record(faults_ledger, "cluster_r3_leader_and_executor_kill", counts)


async def test_a_command_published_during_a_failover_is_queued_once(r3: Cluster, r3_infra: Infra) -> None:
    cfg: Config = r3_infra.cfg  # type: ignore[attr-defined]
    client = ReelClient(r3_infra.nc, cfg)
    killed = await r3.kill_stream_leader(cfg.names.commands_stream)
    try:
        with pytest.raises(CommandTimeout):  # stored (no service here answers it), not "is reel up running?"
            await client.command("recover", encode(RecoverRuns()), timeout_s=1)
    finally:
        await r3.restart(killed)
    info = await r3.stream_info(cfg.names.commands_stream)
    state = info["state"]
    assert isinstance(state, dict) and state["messages"] == 1, "queued once, however often it was re-sent"


async def test_a_missing_commands_stream_is_an_error_at_once(r3: Cluster) -> None:
    cfg = r3_cfg(r3)  # a namespace nobody created
    nc = await connect(cfg, name="reel-tests-r3-missing")
    try:
        t0 = time.monotonic()
        with pytest.raises(ReelError, match="is `reel up`"):
            await ReelClient(nc, cfg).command("recover", encode(RecoverRuns()), timeout_s=1)
        assert time.monotonic() - t0 < cfg.failover_s / 2, "not retried for the failover window"
    finally:
        await nc.close()


async def test_ensure_infra_at_start_waits_out_a_cluster_without_quorum(r3: Cluster) -> None:
    cfg = r3_cfg(r3)
    down = [n.name for n in r3.nodes[1:]]
    for name in down:
        await r3.kill(name)
    nc = await connect(dataclasses.replace(cfg, nats_url=r3.nodes[0].url), name="reel-tests-r3-start")
    try:
        with pytest.raises(Exception):  # noqa: B017 - whatever a cluster without quorum answers
            await ensure_infra(nc, cfg)
        setup = asyncio.ensure_future(ensure_infra_retrying(nc, cfg, within_s=90))
        await asyncio.sleep(1.0)  # the retry is under way before a node comes back
        assert not setup.done()
        for name in down:
            await r3.restart(name)
        infra = await asyncio.wait_for(setup, 90)
        assert (await infra.js.stream_info(cfg.names.events_stream)).config.num_replicas == 3
    finally:
        await nc.close()
        for name in down:
            await r3.restart(name)
