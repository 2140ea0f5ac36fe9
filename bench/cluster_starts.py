"""Benchmark: Reel on a 3-node loopback JetStream cluster at R3.

Three nats-server processes (tests/support/cluster.py), every stream and bucket at R3:

1. **stuck starts** — ``--runs`` starts (batches of ``--batch`` at once) of a one-step workflow
   (a scripted tool) against ``--executors`` executors running in this process, each on its own
   connection to a node that is not the events stream's leader (so its reads are served by a follower), **without the
   recovery service** (so its self-healing cannot hide a lost start). A start is *stuck* when its
   start was acked (a Reply with a run id) but the run has not reached ``verifying`` within
   ``--bound-s`` of the batch's last reply. Before "no run" was asked again of the leader, ≈ 0.3 % were
   (a Direct Get on a lagging follower answered "no run" right after the create).
2. **commit stall at a leader kill** — one writer commits back to back (fenced, on one run's
   subject); after ``--warmup`` commits the events stream's leader is killed (SIGKILL). Reported:
   the longest single commit (s) and the write gap around the kill (kill → next ack, s); then the
   killed node is restarted and every acked commit is checked present once, in order.

    python bench/cluster_starts.py [--runs 2000] [--batch 100] [--executors 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.table import Table

from bench._bench_common import console, machine_note, median, pct
from reel.services.executor.app import serve as executor_serve
from reel.shared.core.wire.subjects import Names
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import connect, ensure_infra
from reel.shared.nats.subjectlog import SubjectLog
from reel.shared.runtime.config import Config
from reel.shared.runtime.logging import setup_logging
from tests.support.cluster import Cluster, cluster


def workflow(i: int) -> WorkflowSpec:
    return parse_workflow({"name": f"r3-start-{i}", "steps": [
        {"kind": "tool", "id": "only", "tool": {"type": "scripted", "outputs": [f"out {i}"]}}]})


async def stuck_starts(c: Cluster, runs: int, batch: int, executors: int, bound_s: float) -> dict[str, float]:
    cfg = Config(nats_url=c.urls, names=Names(f"b{uuid.uuid4().hex[:8]}"), replicas=3, lease_ttl_s=2)
    nc = await connect(cfg, name="bench-r3")
    await ensure_infra(nc, cfg)
    client = ReelClient(nc, cfg)
    # each executor on its own connection to a node that is not the events leader: a Direct Get is
    # answered by the replica of the node a client is connected to, so these read from followers
    leader = await c.stream_leader(cfg.names.events_stream)
    followers = [n for n in c.nodes if n.name != leader]
    conns, tasks, stop = [], [], asyncio.Event()
    for i in range(executors):
        ecfg = dataclasses.replace(cfg, nats_url=followers[i % len(followers)].url)
        conns.append(enc := await connect(ecfg, name=f"bench-r3-executor-{i}"))
        tasks.append(asyncio.create_task(executor_serve(await ensure_infra(enc, ecfg), ecfg, stop)))
    acked = stuck = 0
    start_ms: list[float] = []
    t_all = time.perf_counter()
    try:
        for first in range(0, runs, batch):
            async def one(i: int) -> str | None:
                t0 = time.perf_counter()
                reply = await client.start(workflow(i), idempotency_key=f"{cfg.names.namespace}-{i}", timeout_s=60)
                start_ms.append((time.perf_counter() - t0) * 1000)
                return reply.run_id if reply.ok else None

            ids = [r for r in await asyncio.gather(*(one(i) for i in range(first, min(runs, first + batch)))) if r]
            acked += len(ids)

            async def rested(run_id: str) -> bool:
                try:
                    await client.wait_for(run_id, ("verifying", "completed"), timeout_s=bound_s)
                except TimeoutError:
                    return False
                return True

            stuck += sum(1 for ok in await asyncio.gather(*(rested(r) for r in ids)) if not ok)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for conn in (*conns, nc):
            await conn.close()
    return {"acked": acked, "stuck": stuck, "rate": stuck / max(1, acked), "secs": time.perf_counter() - t_all,
            "start_p50": median(start_ms), "start_p99": pct(start_ms, 99)}


async def leader_kill_stall(c: Cluster, commits: int, warmup: int) -> dict[str, float]:
    cfg = Config(nats_url=c.urls, names=Names(f"b{uuid.uuid4().hex[:8]}"), replicas=3)
    nc = await connect(cfg, name="bench-r3-stall")
    await ensure_infra(nc, cfg)
    log = SubjectLog(nc, cfg.names.events_stream, cfg.names.events)
    acked, lat = [0], []
    killed, t_kill, gap = "", 0.0, 0.0
    for i in range(commits):
        if i == warmup:
            killed = await c.kill_stream_leader(cfg.names.events_stream)
            t_kill = time.perf_counter()
        t0 = time.perf_counter()
        acked.append(await log.append("stall", f"c{i}".encode(), expected_seq=acked[-1]))
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        if i == warmup:
            gap = t1 - t_kill
    await c.restart(killed)
    await c.wait_stream_current(cfg.names.events_stream)
    intact = [s for s, _ in await log.read_raw("stall")] == acked[1:]
    await nc.close()
    before = lat[:warmup]
    return {"max_s": max(lat), "gap_s": gap, "p50_before_ms": median(before) * 1000, "intact": float(intact),
            "commits": float(commits)}


async def main(args: argparse.Namespace) -> None:
    setup_logging("bench", level="ERROR")
    async with cluster() as c:
        starts = await stuck_starts(c, args.runs, args.batch, args.executors, args.bound_s)
        stall = await leader_kill_stall(c, args.commits, args.warmup)
    console.print(machine_note())
    t = Table(title="Reel on a 3-node loopback cluster, R3")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("acked starts", f"{starts['acked']:.0f}")
    t.add_row(f"stuck (not verifying within {args.bound_s:g} s, no recovery service)", f"{starts['stuck']:.0f}")
    t.add_row("stuck-start rate", f"{starts['rate'] * 100:.3f} %")
    t.add_row("start → reply p50 / p99 (ms)", f"{starts['start_p50']:.1f} / {starts['start_p99']:.1f}")
    t.add_row("all starts, wall (s)", f"{starts['secs']:.1f}")
    t.add_row("commit p50 before the kill (ms)", f"{stall['p50_before_ms']:.2f}")
    t.add_row("longest commit around the leader kill (s)", f"{stall['max_s']:.2f}")
    t.add_row("write gap: kill → next ack (s)", f"{stall['gap_s']:.2f}")
    t.add_row(f"{stall['commits']:.0f} acked commits present once, in order", "yes" if stall["intact"] else "NO")
    console.print(t)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--bound-s", type=float, default=30.0)
    p.add_argument("--commits", type=int, default=200)
    p.add_argument("--warmup", type=int, default=50)
    asyncio.run(main(p.parse_args()))
