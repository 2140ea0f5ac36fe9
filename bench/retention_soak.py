"""Retention soak: N finished runs written fast through the event log API, with the retention service's sweep on,
keep the store's size bounded; the same N runs without retention grow it linearly (one embedded nats-server, file
storage, R1; two namespaces, written one after the other in the same run).

Each run is the shape of a one-model-step run: ``run_created`` + ``run_started``; ``attempt_dispatched`` naming a
unique prompt blob (``--blob-bytes``, stored); ``attempt_succeeded`` naming a unique output blob, + ``run_verifying``;
``run_completed``. One workflow blob is shared by every run. ``--concurrency`` runs are written at once, at most
``--rate`` runs a second (default 150: on a loaded 2-core machine one sweep drops ≈ 265 runs and their blobs a
second — a faster writer outruns one retention service and its store grows, more slowly).

With retention the policy is ``keep_newest=K`` (``--keep``) and the blob grace ``--grace-s``; :func:`sweep` runs in a
loop beside the writers (as the retention service does, every ``--sweep-s``). Every 1,000 runs the script prints the
store's size: the bytes JetStream holds in the namespace's streams (events, verdicts, snapshots, outcomes) and its
object store (``OBJ_<ns>_blobs``), read from stream info.

The bound: at most K kept runs plus the runs written since the last finished sweep began (W, the most measured
between two sweep starts, twice over: a sweep reads the runs as they were when it started), each costing what one run
costs in the no-retention namespace (its total ÷ N), plus blobs younger than the grace: ``(K + 2·W) × per-run
bytes``. The script prints it and whether every sample stayed under it (exit 1 if not).

    .venv/bin/python bench/retention_soak.py              # 10,000 runs, keep 1,000
    .venv/bin/python bench/retention_soak.py --runs 2000 --keep 200
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from rich.table import Table

from bench._bench_common import Bench, bench_server, console, machine_note, namespace
from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    RunCompleted,
    RunCreated,
    RunStarted,
    RunVerifying,
    StepDecl,
)
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ExecutorId, StepId, new_run_id
from reel.shared.core.run.retention import RetentionPolicy
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.retention import sweep
from reel.shared.runtime.logging import setup_logging

EXECUTOR = ExecutorId("x-soak00000000")
MAIN = BranchId("main")
STEP = StepId("answer")


async def store_bytes(b: Bench) -> tuple[int, int]:
    """(stream bytes, object-store bytes) JetStream holds for ``b``'s namespace."""
    n = b.cfg.names
    streams = 0
    for s in (n.events_stream, n.verdicts_stream, f"KV_{n.snapshot_bucket}", f"KV_{n.outcome_bucket}"):
        streams += (await b.infra.js.stream_info(s)).state.bytes
    return streams, (await b.infra.js.stream_info(f"OBJ_{n.blob_bucket}")).state.bytes


async def one_run(log: JetStreamEventLog, blobs: JetStreamBlobStore, workflow: BlobRef, size: int) -> None:
    """Write one finished run (4 commits, 2 unique blobs)."""
    run_id = new_run_id()
    now = int(time.time() * 1000)
    lsn = await log.commit(run_id, [
        RunCreated(run_id=run_id, branch_id=MAIN, workflow_name="soak", workflow_ref=workflow, created_ms=now,
                   steps=(StepDecl(step_id=STEP, kind="model"),)),
        RunStarted(executor_id=EXECUTOR, at_ms=now)], expected_lsn=0, writer=EXECUTOR)
    prompt, output = await asyncio.gather(blobs.put(os.urandom(size // 2).hex().encode()),
                                          blobs.put(os.urandom(size // 2).hex().encode()))
    lsn = await log.commit(run_id, [AttemptDispatched(branch_id=MAIN, step_id=STEP, attempt=AttemptNo(1),
                                                      executor_id=EXECUTOR, at_ms=now, prompt_ref=prompt)],
                           expected_lsn=lsn, writer=EXECUTOR)
    lsn = await log.commit(run_id, [
        AttemptSucceeded(branch_id=MAIN, step_id=STEP, attempt=AttemptNo(1), output_ref=output, at_ms=now),
        RunVerifying(branch_id=MAIN, at_ms=now)], expected_lsn=lsn, writer=EXECUTOR)
    await log.commit(run_id, [RunCompleted(branch_id=MAIN, outcome="succeeded", snapshot_lsn=LSN(lsn), at_ms=now)],
                     expected_lsn=lsn, writer=EXECUTOR)


@dataclass
class Soak:
    """One namespace's pass: the size samples (runs written, stream bytes, object bytes) and the sweeps' spacing."""

    samples: list[tuple[int, int, int]] = field(default_factory=list)
    sweeps: int = 0
    dropped: int = 0
    deleted: int = 0
    max_between_sweeps: int = 0
    seconds: float = 0.0


async def soak(b: Bench, args: argparse.Namespace, *, retention: bool) -> Soak:
    log = JetStreamEventLog(b.nc, b.cfg.names)
    blobs = JetStreamBlobStore(b.nc, b.infra.blobs, b.cfg.names.blob_bucket)
    workflow = await blobs.put(b'{"name": "soak", "steps": [{"kind": "model", "id": "answer"}]}' * 64,
                               "application/json")
    out = Soak()
    written = 0
    stop = asyncio.Event()

    async def sweeper() -> None:
        last = 0
        while not stop.is_set():
            at = written
            out.max_between_sweeps = max(out.max_between_sweeps, at - last)
            last = at
            report = await sweep(b.infra, b.cfg.names, RetentionPolicy(keep_newest=args.keep),
                                 now_ms=int(time.time() * 1000), grace_s=args.grace_s)
            out.sweeps += 1
            out.dropped += len(report.dropped)
            out.deleted += report.deleted
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.sweep_s)

    gate = asyncio.Semaphore(args.concurrency)

    t0 = time.perf_counter()

    async def writer(i: int) -> None:
        nonlocal written
        async with gate:
            if args.rate:  # run i starts no earlier than i / rate seconds in
                await asyncio.sleep(max(0.0, t0 + i / args.rate - time.perf_counter()))
            await one_run(log, blobs, workflow, args.blob_bytes)
            written += 1
            if written % 1000 == 0:
                out.samples.append((written, *await store_bytes(b)))

    task = asyncio.create_task(sweeper()) if retention else None
    await asyncio.gather(*(writer(i) for i in range(args.runs)))
    stop.set()
    if task is not None:
        await task
    out.seconds = time.perf_counter() - t0
    return out


async def main(args: argparse.Namespace) -> int:
    async with bench_server() as srv:
        async with namespace(srv, "soakoff") as b:
            off = await soak(b, args, retention=False)
        async with namespace(srv, "soakon") as b:
            on = await soak(b, args, retention=True)
    per_run = (off.samples[-1][1] + off.samples[-1][2]) / off.samples[-1][0]
    window = on.max_between_sweeps
    bound = (args.keep + 2 * window) * per_run
    table = Table(title=f"store size, {args.runs:,} runs of 4 commits + 2 × {args.blob_bytes:,} B blobs at "
                        f"{'full speed' if not args.rate else f'{args.rate:g} runs/s'} "
                        f"(retention: keep newest {args.keep:,}, grace {args.grace_s:g} s, sweep every "
                        f"{args.sweep_s:g} s)")
    for col in ("runs written", "no retention: streams", "objects", "total", "retention: streams", "objects",
                "total", "ratio"):
        table.add_column(col, justify="right")
    worst = 0.0
    for (n, s0, o0), (_, s1, o1) in zip(off.samples, on.samples, strict=True):
        worst = max(worst, s1 + o1)
        table.add_row(f"{n:,}", f"{s0:,}", f"{o0:,}", f"{s0 + o0:,}", f"{s1:,}", f"{o1:,}", f"{s1 + o1:,}",
                      f"{(s1 + o1) / (s0 + o0):.3f}")
    console.print(table)
    console.print(f"no retention: {off.seconds:.1f} s ({args.runs / off.seconds:,.0f} runs/s), {per_run:,.0f} B per "
                  f"run; retention: {on.seconds:.1f} s, {on.sweeps} sweeps, {on.dropped:,} runs dropped, "
                  f"{on.deleted:,} blobs deleted, at most {window:,} runs written between two sweep starts")
    ok = worst <= bound
    console.print(f"bound (K + 2·W) × per-run bytes = ({args.keep:,} + 2 × {window:,}) × {per_run:,.0f} = "
                  f"{bound:,.0f} B; largest sample {worst:,.0f} B: {'under' if ok else 'OVER'} the bound")
    console.print(machine_note())
    return 0 if ok else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--keep", type=int, default=1_000, help="keep_newest of the retention policy")
    p.add_argument("--blob-bytes", type=int, default=8_192, help="size of each run's prompt and output blob")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rate", type=float, default=150.0,
                   help="runs written per second (0: as fast as they go); the collector must keep up with it")
    p.add_argument("--grace-s", type=float, default=1.0, help="the blob collector's grace (s)")
    p.add_argument("--sweep-s", type=float, default=1.0, help="pause between sweeps (s)")
    setup_logging("bench", level="WARNING")
    sys.exit(asyncio.run(main(p.parse_args())))
