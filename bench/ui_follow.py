"""Bytes a browser downloads while following a long agent run on the run page of ``reel ui``: whole bodies vs deltas.

The run: one agent step of K scripted turns, each calling the no-op Python tool once (bench/_wkr_reel.py
``agent_workflow``), run to rest by an in-process executor in namespace A of an embedded nats-server. Its
commits are then replayed one by one, headers and all, into namespace B, which ``reel ui``'s app (over
uvicorn, on a free port, reading as any ``reel ui`` does) serves. After each commit a follower does what
the run page does:

* **body** (what the page did before deltas): the commits above its head (``/runs/<id>/commits``), then the
  whole body again (``/runs/<id>/body``);
* **delta** (what it does now): the same commits, then only the fragments that changed
  (``/runs/<id>/delta?since=<its head>``).

Both follow the same replay, commit by commit, over real HTTP (aiohttp; uncompressed bytes of each answer's
body). The first page load is the same for both and counted apart.

Usage: ``python bench/ui_follow.py [--turns 80]``; last line ``ratio delta_vs_body=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from pathlib import Path

import aiohttp
from _bench_common import bench_server, machine_note, namespace
from _wkr_reel import agent_workflow
from rich.console import Console
from rich.table import Table

from reel.services.ui.app import create_app, serve
from reel.services.ui.reader import RunReader
from reel.shared.nats.client import ReelClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the no-op tool is bench._wkr_tools:noop


async def _run_to_rest(a: object, turns: int) -> str:
    from reel.services.executor.app import serve as executor

    assert hasattr(a, "infra") and hasattr(a, "cfg")
    client = ReelClient(a.infra.nc, a.cfg, None)
    stop = asyncio.Event()
    task = asyncio.create_task(executor(a.infra, a.cfg, stop))
    try:
        reply = await client.start(agent_workflow(0, turns))
        run_id = reply.run_id
        assert run_id, reply
        deadline = time.monotonic() + 300
        while True:  # until the run rests (no verifier runs here: it waits in `verifying`)
            state = await client.log.load(run_id)
            if str(state.status) in ("verifying", "completed", "cancelled"):
                return run_id
            assert time.monotonic() < deadline, state.status
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=80, help="agent turns, each with one tool call (default 80)")
    args = ap.parse_args()
    console = Console()
    tag = uuid.uuid4().hex[:6]
    async with bench_server() as srv, namespace(srv, f"uifa{tag}") as a, namespace(srv, f"uifb{tag}") as b:
        run_id = await _run_to_rest(a, args.turns)
        last = (await a.infra.js.stream_info(a.cfg.names.events_stream)).state.last_seq
        raw = [await a.infra.js.get_msg(a.cfg.names.events_stream, seq) for seq in range(1, last + 1)]
        assert all(m.subject == a.cfg.names.events(run_id) for m in raw), "namespace A holds only the run"

        async def publish(i: int) -> None:
            m = raw[i]
            headers = {k: v for k, v in (m.headers or {}).items() if not k.startswith("Nats-Expected")}
            ack = await b.infra.js.publish(b.cfg.names.events(run_id), m.data or b"", headers=headers)
            assert ack.seq == i + 1, (ack.seq, i)

        from reel.shared.nats.blobstore import JetStreamBlobStore

        reader = RunReader(ReelClient(b.infra.nc, b.cfg, JetStreamBlobStore(b.infra.nc, b.infra.blobs,
                                                                            b.cfg.names.blob_bucket)))
        started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        server = asyncio.create_task(serve(create_app(reader), "127.0.0.1", 0, started=started))
        url = await started
        sent = {"body": 0, "delta": 0}
        biggest = {"body": 0, "delta": 0}
        full_answers = 0
        try:
            async with aiohttp.ClientSession() as http:
                async def get(path: str) -> bytes:
                    async with http.get(url + path) as r:
                        assert r.status == 200, (path, r.status, await r.text())
                        return await r.read()

                await publish(0)
                first = len(await get(f"/runs/{run_id}"))
                head = 1
                t0 = time.monotonic()
                for i in range(1, len(raw)):
                    await publish(i)
                    commits = len(await get(f"/runs/{run_id}/commits?after={head}"))
                    whole = len(await get(f"/runs/{run_id}/body"))
                    d = await get(f"/runs/{run_id}/delta?since={head}")
                    full_answers += b'"full"' in d[:40]
                    for k, n in (("body", commits + whole), ("delta", commits + len(d))):
                        sent[k] += n
                        biggest[k] = max(biggest[k], n)
                    head = i + 1
                took = time.monotonic() - t0
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server
    table = Table(title=f"following a {args.turns}-turn agent run: {len(raw)} commits, one update per commit")
    for col in ("follower", "bytes downloaded", "largest update", "per update (mean)"):
        table.add_column(col, justify="right" if col != "follower" else "left")
    for k, what in (("body", "whole body per commit (before)"), ("delta", "changed fragments (now)")):
        table.add_row(what, f"{sent[k]:,}", f"{biggest[k]:,}", f"{sent[k] // max(1, len(raw) - 1):,}")
    console.print(table)
    console.print(f"first page load (both): {first:,} bytes; delta answers that fell back to the whole body: "
                  f"{full_answers}; {took:.1f} s for both followers")
    console.print(machine_note())
    print(f"ratio delta_vs_body={sent['delta'] / sent['body']:.4f}")


if __name__ == "__main__":
    asyncio.run(main())
