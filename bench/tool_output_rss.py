"""Benchmark: the executor's peak RSS while a tool prints N bytes and the next step reads them.

One embedded nats-server (file storage, R1). Per output size, a fresh executor **process**
(``python -m reel.services.executor``, its cap raised to 256 MiB so every size is stored whole) is
started and warmed by one small run; its RSS then is the **idle** baseline. Then one run is started
and awaited (Verifying): its command tool (tests/support/print_bytes.py) prints N bytes, and a second
command step (``stdin_from`` the first) reads them all from its stdin and prints their length and
sha256. The executor's **peak** RSS is its ``VmHWM`` (/proc/<pid>/status) after it, **time** is
start → Verifying (s); the stored blob's sha256 is checked against what the tool printed, and the
consumer's line against it (what reached its stdin). A bounded executor shows peak − idle
independent of N. ``--no-consumer``: the printing step alone.

    python bench/tool_output_rss.py [--sizes-mb 0,1,10,50,200] [--executor-repo PATH]... [--no-consumer]
                                    [--timeout-s 900]

``--executor-repo``: run the executor from another checkout (e.g. one before the output limits,
to compare; repeat it to compare several in one run); its output is then checked the same way (a
silent cut shows as ``MISMATCH``). A run not in Verifying after ``--timeout-s`` is a row with its
peak so far and the executor's most frequent warnings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the tests' printing tool

from _bench_common import Bench, bench_server, console, machine_note, namespace  # noqa: E402
from rich.table import Table  # noqa: E402

from reel.shared.core.run.state import RunState  # noqa: E402
from reel.shared.core.workflow.spec import parse_workflow  # noqa: E402
from reel.shared.nats.blobstore import JetStreamBlobStore  # noqa: E402
from reel.shared.nats.client import ReelClient  # noqa: E402
from tests.support import print_bytes  # noqa: E402

PRINTER = REPO / "tests" / "support" / "print_bytes.py"
CAP = 256 * 1024 * 1024
MB = 1_000_000
DIGEST = ("import hashlib, sys\nh, n = hashlib.sha256(), 0\nwhile b := sys.stdin.buffer.read1(1 << 20):\n"
          "    h.update(b); n += len(b)\nprint(n, h.hexdigest())\n")


def _status_mb(pid: int, field: str) -> float:
    """A ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``) in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / MB
    raise KeyError(field)


@contextlib.asynccontextmanager
async def executor_process(b: Bench, repo: Path, log: IO[bytes]) -> AsyncIterator[asyncio.subprocess.Process]:
    """A separate executor process (the code of checkout ``repo``) on ``b``'s namespace, logging JSON lines
    into ``log``; SIGTERM on exit."""
    env = {**os.environ, "NATS_URL": b.cfg.nats_url, "REEL_NAMESPACE": b.cfg.names.namespace,
           "REEL_TOOL_MAX_OUTPUT_BYTES": str(CAP), "REEL_LOG_FORMAT": "json", "PYTHONPATH": str(repo),
           "PYTHONDONTWRITEBYTECODE": "1"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.executor", cwd=repo, env=env,
                                                stdout=log, stderr=log)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _complaints(log: IO[bytes]) -> str:
    """The executor's most frequent warning/error events (``event×count``), from its JSON log lines."""
    log.seek(0)
    seen: Counter[str] = Counter()
    for line in log:
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if rec.get("level") in ("warning", "error", "critical"):
                seen[f"{rec.get('event')}{' ' + str(rec['error_kind']) if rec.get('error_kind') else ''}"] += 1
    return ", ".join(f"{e}×{n}" for e, n in seen.most_common(2)) or "no warnings logged"


async def _run(client: ReelClient, name: str, tool: dict[str, object], consumer: bool = False,
               timeout_s: float = 900) -> tuple[RunState, float]:
    t0 = time.monotonic()
    steps: list[dict[str, object]] = [{"kind": "tool", "id": "dump", "tool": tool}]
    if consumer:
        steps.append({"kind": "tool", "id": "digest", "tool": {
            "type": "command", "argv": [sys.executable, "-c", DIGEST], "stdin_from": "dump", "timeout_s": 900}})
    started = await client.start(parse_workflow({"name": name, "steps": steps}), timeout_s=60)
    assert started.ok and started.run_id, started
    state = await client.wait_for(started.run_id, ("verifying",), timeout_s=timeout_s)
    return state, time.monotonic() - t0


async def one_size(b: Bench, n_bytes: int, repo: Path, consumer: bool,
                   timeout_s: float) -> tuple[float, float, float, str]:
    """Idle RSS (MB), peak RSS (MB), time (s) and the sha256 checks (``ok``, or what did not match) for one
    tool printing ``n_bytes`` (and, with ``consumer``, a step reading them from its stdin); a run not in
    Verifying after ``timeout_s`` is reported with the peak so far and the executor's complaints."""
    blobs = JetStreamBlobStore(b.nc, b.infra.blobs, b.cfg.names.blob_bucket)
    client = ReelClient(b.nc, b.cfg, blobs)
    with tempfile.TemporaryFile() as log:
        async with executor_process(b, repo, log) as proc:
            await _run(client, "warm", {"type": "recorded", "output": "warm"})
            idle = _status_mb(proc.pid, "VmRSS")
            try:
                state, took = await _run(client, "big", {"type": "command", "argv": [
                    sys.executable, str(PRINTER), str(n_bytes)], "timeout_s": 900}, consumer, timeout_s)
            except TimeoutError:
                peak = _status_mb(proc.pid, "VmHWM")
                return idle, peak, timeout_s, f"not verifying after {timeout_s:g} s: {_complaints(log)}"
            peak = _status_mb(proc.pid, "VmHWM")
    (a,) = state.branches["main"].attempts["dump"]
    assert a.status == "succeeded" and a.output_ref is not None, a
    size = await blobs.get_file(a.output_ref, None)  # streamed back; raises BlobCorrupt unless it hashes to its ref
    want = print_bytes.sha256_of(n_bytes)
    ok = "ok" if (size, a.output_ref.sha256) == (n_bytes, want) else "MISMATCH"
    if consumer:
        (c,) = state.branches["main"].attempts["digest"]
        line = (await blobs.get(c.output_ref)).decode().strip() if c.output_ref else f"{c.status} {c.error_kind}"
        ok += "/ok" if line == f"{n_bytes} {want}" else f"/stdin MISMATCH ({line[:60]})"
    return idle, peak, took, ok


async def main(sizes_mb: list[int], repos: list[Path], consumer: bool, timeout_s: float) -> None:
    title = "executor peak RSS vs tool output size" + (", read back by a stdin_from step" if consumer else "")
    table = Table(title=f"{title} (fresh executor process per row)")
    for col in ("executor code", "output (MB)", "idle RSS (MB)", "peak RSS (MB)", "peak − idle (MB)",
                "start → verifying (s)", "MB/s", "blob sha256" + (" / stdin" if consumer else "")):
        table.add_column(col, justify="right")
    async with bench_server() as srv:
        for r, repo in enumerate(repos):
            for i, mb in enumerate(sizes_mb):
                async with namespace(srv, f"rss{r}x{i}") as b:
                    idle, peak, took, ok = await one_size(b, mb * MB, repo, consumer, timeout_s)
                table.add_row(_describe(repo), str(mb), f"{idle:.1f}", f"{peak:.1f}", f"{peak - idle:.1f}",
                              f"{took:.2f}", f"{mb / took:.0f}" if mb else "-", ok)
    console.print(table)
    console.print(machine_note())


def _describe(repo: Path) -> str:
    """``repo`` and its commit (``git describe``, if it is a checkout)."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return f"{repo.name} @ " + subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"],
                                                  check=True, capture_output=True, text=True).stdout.strip()
    return repo.name


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default="0,1,10,50,200")
    parser.add_argument("--executor-repo", type=Path, action="append",
                        help="run the executor from this checkout (repeat to compare; default: this one)")
    parser.add_argument("--no-consumer", action="store_true", help="no stdin_from step reading the output back")
    parser.add_argument("--timeout-s", type=float, default=900, help="per run: start → Verifying (s)")
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes_mb.split(",")], [r.resolve() for r in args.executor_repo or [REPO]],
                     not args.no_consumer, args.timeout_s))
