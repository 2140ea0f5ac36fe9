"""Benchmark: does an executor's lease survive a blocked event loop, and how late do its renewals land?

One embedded nats-server (file storage, R1). The lease (``reel.shared.nats.leases.Lease``, TTL ``--ttl``) is held
on this process's event loop; that loop is then blocked ``--rounds`` times by a CPU-bound call of ``--block``
seconds (a loop starved as on a loaded CI machine), with ``--gap`` seconds of a free loop in between.

An observer thread with its own event loop and NATS connection reads the lease entry every 20 ms and records
the moment each new revision appears on the server, and whether the entry was ever absent. Figures:

* **gap** — seconds between two renewals as the server stored them (the renewal period is TTL / 3);
* **late** — ``gap - TTL/3``: how late a renewal landed (p50, p90, max);
* **absent** — the entry was seen absent (another executor may take the runs over);
* **held after** — after how many blocks the holder still held its lease (``Lease.held()``).

    python bench/lease_stall.py [--ttl 2] [--block 1.5] [--rounds 5] [--gap 1]

A holder whose ``Lease`` takes no ``connect`` (renewals on the event loop, before they had a thread of their
own) is measured the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import itertools
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _bench_common import bench_server, console, machine_note, median, pct  # noqa: E402
from nats.js.errors import KeyNotFoundError  # noqa: E402
from nats.js.kv import KeyValue  # noqa: E402
from rich.table import Table  # noqa: E402

from reel.shared.core.wire.subjects import Names  # noqa: E402
from reel.shared.nats.infra import connect, ensure_infra  # noqa: E402
from reel.shared.nats.leases import Lease  # noqa: E402
from reel.shared.runtime.config import Config  # noqa: E402

KEY = "x-bench-stall"


class Observer:
    """Reads the entry from a thread of its own (its loop never blocked by the holder's)."""

    def __init__(self, cfg: Config, kv: KeyValue) -> None:
        self.cfg, self.src = cfg, kv
        self.revisions: list[tuple[float, int]] = []
        self.absent_s: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        nc = await connect(self.cfg, name="bench-observer")
        src = self.src
        kv = KeyValue(src._name, src._stream, src._pre, nc.jetstream(), False)
        try:
            while not self.stop.is_set():
                try:
                    entry = await kv.get(KEY)
                    if entry.value and (not self.revisions or self.revisions[-1][1] != entry.revision):
                        self.revisions.append((time.monotonic(), entry.revision or 0))
                except KeyNotFoundError:
                    if self.revisions:
                        self.absent_s.append(time.monotonic())
                await asyncio.sleep(0.02)
        finally:
            await nc.close()


def block(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(10_000))


async def main(args: argparse.Namespace) -> None:
    async with bench_server() as srv:
        cfg = Config(nats_url=srv.url, names=Names("bstall"), replicas=1, storage="file", lease_ttl_s=int(args.ttl))
        nc = await connect(cfg, name="bench-holder")
        try:
            infra = await ensure_infra(nc, cfg)  # the lease bucket's max age: --ttl
            kwargs: dict[str, Any] = {}
            threaded = "connect" in inspect.signature(Lease).parameters
            if threaded:
                kwargs["connect"] = lambda: connect(cfg, name="bench-lease")
            lease = Lease(infra.leases, KEY, args.ttl, **kwargs)
            stop = asyncio.Event()
            assert await lease.acquire(stop)
            keeper = asyncio.create_task(lease.keep(stop))
            obs = Observer(cfg, infra.leases)
            obs.thread.start()
            await asyncio.sleep(args.gap)
            held_after = 0
            for _ in range(args.rounds):
                block(args.block)
                if lease.held():
                    held_after += 1
                await asyncio.sleep(args.gap)
            stop.set()
            await asyncio.wait_for(keeper, 10)
            obs.stop.set()
            await asyncio.to_thread(obs.thread.join, 10)
        finally:
            await nc.close()
    beat = args.ttl / 3
    times = [t for t, _ in obs.revisions]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    late = [max(0.0, g - beat) for g in gaps]
    table = Table(title=f"lease renewals under a blocked loop: TTL {args.ttl}s, {args.rounds} blocks of "
                        f"{args.block}s ({'own thread' if threaded else 'on the event loop'})")
    for col in ("renewals", "gap p50 s", "gap max s", "late p50 s", "late p90 s", "late max s", "absent",
                "held after"):
        table.add_column(col, justify="right")
    table.add_row(str(len(times)), f"{median(gaps):.3f}", f"{max(gaps):.3f}", f"{median(late):.3f}",
                  f"{pct(late, 90):.3f}", f"{max(late):.3f}", "yes" if obs.absent_s else "no",
                  f"{held_after}/{args.rounds}")
    console.print(table)
    console.print(machine_note())


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ttl", type=float, default=2.0)
    p.add_argument("--block", type=float, default=1.5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--gap", type=float, default=1.0)
    asyncio.run(main(p.parse_args()))
