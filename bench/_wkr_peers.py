"""The anchors of bench/w_kr.py: raw acked publishes, and the peers' own scripts (not part of Reel).

* **Raw**: the method of ../shared/peers/bench_nats.py, on the benchmark's own server (a stream
  ``WKR_RAW`` beside Reel's, file storage): a step builds the 200-byte dict and awaits one
  ``js.publish`` ack; (a) the median interval between successive step starts and wall/K, (b) R
  asyncio tasks of K sequential publishes, steps/s.
* **Peers**: ``bench_langgraph.py --saver sync --durability sync`` and ``bench_restate.py`` from
  ``--peers DIR`` (their venvs from ``DIR/setup.sh``, under /tmp/peersvenv), one repetition per
  call (``--reps 1``), so their rounds interleave with Reel's; each writes its JSON to a temp dir.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from _wkr_reel import make_result
from nats.js import JetStreamContext
from nats.js import api as jsapi

RAW_STREAM = "WKR_RAW"
PEER_TIMEOUT_S = 170.0


@dataclass(frozen=True)
class Sample:
    """One repetition: (a) median µs/step and wall µs/step, or (b) steps/s (NaN where not measured)."""

    a_median_us: float = float("nan")
    a_wall_us: float = float("nan")
    b_steps_per_s: float = float("nan")


def median_interval_us(starts_ns: list[int]) -> float:
    """Median of the intervals between successive step starts, µs."""
    return statistics.median((b - a) / 1000 for a, b in itertools.pairwise(starts_ns))


async def ensure_raw_stream(js: JetStreamContext) -> None:
    """The raw stream (file storage, R1), like bench_nats.py's ``BENCH``."""
    await js.add_stream(jsapi.StreamConfig(name=RAW_STREAM, subjects=["wkr.raw.>"], storage=jsapi.StorageType.FILE))


async def _raw_run(js: JetStreamContext, run: int, k: int, starts: list[int] | None = None) -> None:
    for i in range(k):
        t0 = time.perf_counter_ns()
        if starts is not None:
            starts.append(t0)
        await js.publish(f"wkr.raw.{run}", json.dumps(make_result(run, i)).encode())


async def raw_a(js: JetStreamContext, run: int, k: int) -> Sample:
    """(a): one run of ``k`` sequential acked publishes."""
    starts: list[int] = []
    t0 = time.perf_counter_ns()
    await _raw_run(js, run, k, starts)
    return Sample(a_median_us=median_interval_us(starts), a_wall_us=(time.perf_counter_ns() - t0) / 1000 / k)


async def raw_b(js: JetStreamContext, run: int, r: int, k: int) -> Sample:
    """(b): ``r`` concurrent runs of ``k`` sequential acked publishes each."""
    t0 = time.perf_counter()
    await asyncio.gather(*(_raw_run(js, run + i, k) for i in range(r)))
    return Sample(b_steps_per_s=r * k / (time.perf_counter() - t0))


def _log_file(path: Path) -> BinaryIO:
    return path.open("ab")


PEERS = {
    "langgraph": ("langgraph", "bench_langgraph.py", ["--saver", "sync", "--durability", "sync"],
                  "langgraph_sync_sync.json"),
    "restate": ("restate", "bench_restate.py", [], "restate.json"),
}


async def run_peer(name: str, peers_dir: Path, venvs: Path, out_dir: Path, *, ka: int, rb: int, kb: int
                   ) -> tuple[Sample, Sample] | str:
    """One ``--reps 1`` call of a peer's script: its (a) and (b) samples, or why it failed."""
    venv, script, extra, result = PEERS[name]
    res_dir = out_dir / f"peer-{name}"
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / result).unlink(missing_ok=True)
    argv = [str(venvs / venv / "bin" / "python"), str(peers_dir / script), *extra, "--reps", "1",
            "--ka", str(ka), "--rb", str(rb), "--kb", str(kb)]
    with _log_file(out_dir / f"peer-{name}.log") as log:
        proc = await asyncio.create_subprocess_exec(*argv, cwd=str(peers_dir), stdout=log, stderr=log,
                                                    env={**os.environ, "PEERS_RESULTS": str(res_dir)})
        try:
            rc = await asyncio.wait_for(proc.wait(), PEER_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return f"{name}: timed out after {PEER_TIMEOUT_S:.0f} s"
    if rc != 0 or not (res_dir / result).is_file():
        return f"{name}: exit {rc} (log {out_dir / f'peer-{name}.log'})"
    data = json.loads((res_dir / result).read_text())
    return (Sample(a_median_us=data["a_median_us_per_step"]["median"], a_wall_us=data["a_wall_us_per_step"]["median"]),
            Sample(b_steps_per_s=data["b_steps_per_s"]["median"]))
