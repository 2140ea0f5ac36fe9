"""The run page of a long agent run: HTML bytes and partition chips with every partition in full vs collapsed.

One embedded nats-server with Reel's executor and verifier (bench/_wkr_reel.py ``reel_stack``) runs
bench/w_kr.py's agent workload: one agent step of ``--turns`` scripted turns, each calling the no-op
Python tool once, then a final answer; the default context budget (8,000 tokens), so the oldest turns
are left out (``available``) once it runs out. Its log is then folded up to the end of turn 25, 50, 100,
… and the last turn, and each state's run page is rendered through ``reel ui``'s own templates twice:

* **full** — every turn's partition with all its items (what the page showed before collapsing: one chip
  per item, so the chips grow with the square of the turns);
* **collapsed** — what ``reel ui`` serves: a partition that differs from the turn before in at most half
  its items reads "same as turn k except …", listing only the differences;
* **baseline** — the page as ``--baseline`` (a git revision, default the last one before partitions showed
  their budget and collapsed; extracted with ``git archive``) renders the same log, in a subprocess.

For the whole run the page is also fetched from a real ``reel ui`` app (``/runs/<id>``) and checked to be
the collapsed rendering (the same chips; the same bytes but for ages and times). Chips are the page's
``class="item"`` elements.

    python bench/ui_run_page.py [--turns 200] [--baseline 8bf52eb]

Last line: ``ratio bytes_collapsed_vs_baseline=<x> chips_collapsed_vs_baseline=<y>
bytes_collapsed_vs_full=<z>`` at the last turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from _bench_common import machine_note
from _wkr_reel import REPO, WORKFLOWS, reel_stack
from rich.console import Console
from rich.table import Table

from reel.services.ui import pages
from reel.services.ui.app import _env, create_app, serve
from reel.services.ui.reader import RunReader
from reel.services.ui.runview import run_page
from reel.shared.core.run.events import AttemptDispatched, Commit, encode_commit
from reel.shared.core.run.fold import fold
from reel.shared.core.run.state import RunState

BASELINE = "8bf52eb"  # main before partitions showed their budget and collapsed
BASELINE_RENDER = """
import sys, json
from reel.shared.core.run.events import decode_commit
from reel.shared.core.run.fold import fold
from reel.services.ui import pages
from reel.services.ui.app import _env
from reel.services.ui.runview import run_page
log = [(lsn, decode_commit(bytes.fromhex(h))) for lsn, h in json.load(open(sys.argv[1]))]
for m in sys.argv[2:]:
    st = fold(log, None if m == "-" else int(m))
    html = _env().get_template("run.html").render(namespace="reel", server="", statuses=pages.STATUSES,
                                                  p=run_page(st), branch_param="", page_bytes=pages.PAGE_BYTES)
    data = html.encode()
    print(len(data), data.count(b'class="item"'))
"""


def baseline_pages(rev: str, log: list[tuple[int, Commit]], uptos: list[int | None], tmp: str) -> list[tuple[int, int]]:
    """(bytes, chips) of the run page at each LSN of ``uptos`` (``None``: the whole log) as ``rev`` renders it."""
    tree = Path(tmp, f"reel-{rev}")
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    path = Path(tmp, "log.json")
    path.write_text(json.dumps([(lsn, encode_commit(c).hex()) for lsn, c in log]))
    out = subprocess.run([sys.executable, "-P", "-c", BASELINE_RENDER, str(path),
                          *("-" if u is None else str(u) for u in uptos)], check=True, capture_output=True,
                         text=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}).stdout
    return [(int(a), int(b)) for a, b in (line.split() for line in out.splitlines())]


def render(state: RunState, *, collapse: bool) -> tuple[bytes, float]:
    """The run page's HTML as ``reel ui`` renders it (run.html), and the render time (ms)."""
    env = _env()
    t0 = time.perf_counter()
    html = env.get_template("run.html").render(namespace="reel", server="", statuses=pages.STATUSES,
                                               p=run_page(state, collapse_partitions=collapse), branch_param="",
                                               page_bytes=pages.PAGE_BYTES)
    return html.encode(), 1000 * (time.perf_counter() - t0)


def turn_ends(log: list[tuple[int, Commit]]) -> dict[int, int]:
    """The LSN before each turn's intent (turn k → the last LSN of turn k - 1), turns counted from 1."""
    out: dict[int, int] = {}
    prev = 0
    for lsn, c in log:
        for e in c.events:
            if isinstance(e, AttemptDispatched) and ":t" in e.step_id and e.step_id.count(":") == 1:
                out.setdefault(int(e.step_id.rsplit(":t", 1)[1]), prev)
        prev = lsn
    return out


async def main(args: argparse.Namespace) -> None:
    load0 = machine_note()
    k = args.turns
    with tempfile.TemporaryDirectory(prefix="ui-run-page-") as tmp:
        async with reel_stack("default", tmp, 1) as stack:
            spec = WORKFLOWS["agent"](0, k)
            t0 = time.perf_counter()
            run_id, _, _ = await stack.run(spec, f"ui-page-{uuid.uuid4().hex[:6]}", timeout_s=900)
            print(f"run {run_id}: {k} turns in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            log = [(int(lsn), c) for lsn, c in await stack.client.log.read(run_id)]
            app = create_app(RunReader(stack.client))
            started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            server = asyncio.create_task(serve(app, "127.0.0.1", 0, started=started))
            url = await started

            def get() -> bytes:
                with urllib.request.urlopen(f"{url}/runs/{run_id}", timeout=120) as r:
                    data: bytes = r.read()
                    return data

            t1 = time.perf_counter()
            served = await asyncio.to_thread(get)
            served_ms = 1000 * (time.perf_counter() - t1)
            server.cancel()
        ends = turn_ends(log)
        marks = [t for t in (25, 50, 100, 200, 400, 800) if t < k] + [k + 1]
        uptos = [ends.get(t + 1) for t in marks]
        base = baseline_pages(args.baseline, log, uptos, tmp)
    rows = []
    for t, upto, (bb, bc) in zip(marks, uptos, base, strict=True):
        state = fold(log, upto)
        assert state is not None
        full, full_ms = render(state, collapse=False)
        small, small_ms = render(state, collapse=True)
        rows.append((t, state.head_lsn, bb, bc, len(full), full.count(b'class="item"'), full_ms, len(small),
                     small.count(b'class="item"'), small_ms))
    last = fold(log)
    assert last is not None
    small = render(last, collapse=True)[0]  # as the app rendered it (but for ages and times: the clock moved)
    assert served.count(b'class="item"') == small.count(b'class="item"') and abs(len(served) - len(small)) < 200
    table = Table(title=f"run page of a {k}-turn agent run (one tool call a turn, budget 8,000 tokens)")
    for col in ("turns", "head lsn", f"{args.baseline} bytes", f"{args.baseline} chips", "full bytes", "full chips",
                "full ms", "collapsed bytes", "collapsed chips", "collapsed ms", "bytes vs base", "chips vs base"):
        table.add_column(col, justify="right")
    for t, lsn, bb, bc, fb, fc, fms, sb, sc, sms in rows:
        table.add_row(str(t), str(lsn), f"{bb:,}", f"{bc:,}", f"{fb:,}", f"{fc:,}", f"{fms:.0f}", f"{sb:,}",
                      f"{sc:,}", f"{sms:.0f}", f"{sb / bb:.3f}", f"{sc / bc:.3f}" if bc else "-")
    console = Console(width=170)
    console.print(table)
    console.print(f"served /runs/<id> at the end: {len(served):,} bytes in {served_ms:.0f} ms (= collapsed)")
    console.print(f"load before: {load0}; after: {machine_note()}")
    _, _, bb, bc, fb, fc, _, sb, sc, _ = rows[-1]
    print(f"ratio bytes_collapsed_vs_baseline={sb / bb:.3f} chips_collapsed_vs_baseline={sc / bc:.3f} "
          f"bytes_collapsed_vs_full={sb / fb:.3f}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=200, help="tool-calling turns of the agent run (then one answer)")
    ap.add_argument("--baseline", default=BASELINE, help="git revision whose run page is measured beside")
    return ap.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
