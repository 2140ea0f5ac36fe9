"""Benchmark: the ``reel ui`` runs page at 10,000 runs — server time and bytes, from the index vs a scan.

One embedded nats-server (file storage, R1). ``--runs`` runs (default 10,000) are written straight through the
event log (``tests/ui/fakeruns.py``: two commits a run, pipelined; passed, failed, retried, running and
cancelled runs, labels ``team=…``). Then ``reel ui``'s app (``services/ui/app.py``) is served by uvicorn in
this process over a :class:`~reel.services.ui.reader.RunReader` whose index is built from the stream (the time
that takes is printed: it is paid once per UI process start).

* **index** — ``GET /…`` over HTTP for each query (page 1, page 2, the last page, ``status=failed``,
  ``outcome=succeeded``, ``label=team=infra``, ``q=team=infra``, ``q=429``, a two-character ``q``); server time
  is the response's ``Server-Timing`` total (the catch-up check against the stream, the index query, the
  render), median of ``--reps``; bytes are the body's.
* **scan** (the baseline, measured in the same run): the runs page as it was built before the index — every
  run listed and loaded (``RunReader.rows``: snapshot-aware loads, 16 at once), filtered in Python, every
  matching row rendered (no pages) with today's templates; ``--scan-reps`` times (default 1: it is slow).

    python bench/ui_runs_page.py [--runs 10000] [--reps 5] [--scan-reps 1]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/ui/fakeruns.py

import aiohttp  # noqa: E402
from _bench_common import bench_server, console, machine_note, median, namespace  # noqa: E402
from rich.table import Table  # noqa: E402

from reel.services.ui import pages  # noqa: E402
from reel.services.ui.app import _env, create_app, serve  # noqa: E402
from reel.services.ui.reader import RunReader  # noqa: E402
from reel.services.ui.runindex import RunsPage  # noqa: E402
from reel.shared.nats.client import ReelClient  # noqa: E402
from tests.ui.fakeruns import fill  # noqa: E402


def _server_ms(timing: str) -> float:
    parts = dict(p.strip().split(";dur=") for p in timing.split(","))
    return float(parts["total"])


async def _scan_page(reader: RunReader, status: str, q: str) -> tuple[float, int]:
    """The runs page as the scan built it: (ms, bytes)."""
    env = _env()
    t0 = time.perf_counter()
    rows = tuple(r for r in await reader.rows() if pages.matches(r, status, q))
    page = RunsPage(rows=rows, total=len(rows), first=1 if rows else 0, newer=None, older=None)
    filt = {k: v for k, v in (("status", status), ("q", q)) if v}
    body = env.get_template("runs.html").render(
        namespace=reader.namespace, server="", statuses=pages.STATUSES, page=page, rows=rows, f=_F(status, q),
        status=status, q=q, filt=filt, outcomes=[], caught_up=True, index_ready=True, indexed=len(rows),
        listed=len(rows), first_page=True, page_size=len(rows), upper="")
    return (time.perf_counter() - t0) * 1000, len(body.encode())


class _F:
    def __init__(self, status: str, q: str) -> None:
        self.status, self.q, self.outcome, self.label = status, q, "", ""


async def main(n: int, reps: int, scan_reps: int) -> None:
    async with bench_server() as srv, namespace(srv, "uibench") as b:
        client = ReelClient(b.nc, b.cfg)
        t0 = time.perf_counter()
        runs = await fill(client.log, n, t0_ms=int(time.time() * 1000) - 3_600_000)
        fill_s = time.perf_counter() - t0
        reader = RunReader(client)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        async with reader.indexing():
            while not await reader.caught_up(60):
                pass
            build_s = time.perf_counter() - t0
            rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(serve(create_app(reader), "127.0.0.1", 0, started=started))
            url = await started
            older = {r.created_lsn for r in runs}
            keys = sorted(older)
            cases: list[tuple[str, dict[str, Any]]] = [
                ("page 1", {}), ("page 2", {"before": keys[-100]}),
                ("last page", {"before": keys[min(len(keys) - 1, 100)]}),
                ("status=failed", {"status": "failed"}), ("outcome=succeeded", {"outcome": "succeeded"}),
                ("label=team=infra", {"label": "team=infra"}), ("q=team=infra", {"q": "team=infra"}),
                ("q=429", {"q": "429"}), ("q=wf (2 chars: no trigram)", {"q": "wf"}),
            ]
            table = Table(title=f"runs page at {n:,} runs (server ms: median of {reps}; bytes of the page)")
            for col in ("query", "path", "runs shown / matching", "server ms", "bytes"):
                table.add_column(col, justify="left" if col in ("query", "path") else "right")
            got: dict[str, tuple[float, int]] = {}
            async with aiohttp.ClientSession() as http:
                for name, params in cases:
                    times, size, shown, total = [], 0, 0, ""
                    for _ in range(reps + 1):  # the first is a warm-up
                        async with http.get(f"{url}/?{urlencode(params)}") as r:
                            body = await r.read()
                            assert r.status == 200, (name, r.status)
                            times.append(_server_ms(r.headers["Server-Timing"]))
                        size, shown = len(body), body.count(b"<tr data-run=")
                        total = body.decode().split('class="range">', 1)[1].split("</span>", 1)[0]
                    got[name] = (median(times[1:]), size)
                    table.add_row(name, "index", f"{shown} ({total})", f"{median(times[1:]):.1f}", f"{size:,}")
                for name, status, q in (("page 1", "", ""), ("status=failed", "failed", ""),
                                        ("q=team=infra", "", "team=infra")):
                    scans = [await _scan_page(reader, status, q) for _ in range(scan_reps)]
                    ms, size = median([s[0] for s in scans]), scans[-1][1]
                    new_ms, new_size = got[name]
                    table.add_row(name, "scan (before)", "every match", f"{ms:,.0f}", f"{size:,}")
                    table.add_row("", "ratio index/scan", "", f"{new_ms / ms:.4f}", f"{new_size / size:.4f}")
            task.cancel()
        console.print(table)
        console.print(f"fill: {n:,} runs in {fill_s:.1f} s; index build from the stream: {build_s:.1f} s "
                      f"(max RSS {rss0 / 1024:.0f} → {rss1 / 1024:.0f} MiB); target: every index query < 100 ms "
                      f"— {'met' if all(v[0] < 100 for v in got.values()) else 'MISSED'}")
        console.print(machine_note())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--scan-reps", type=int, default=1)
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.reps, args.scan_reps))
