"""Benchmark (issue 10 item 4): the executor's peak RSS while a tool prints N bytes of output.

One embedded nats-server (file storage, R1). Per output size, a fresh executor **process**
(``python -m services.executor``, its cap raised to 256 MiB so every size is stored whole) is
started and warmed by one small run; its RSS then is the **idle** baseline. Then one run whose
command tool (tests/support/print_bytes.py) prints N bytes is started and awaited (Verifying);
the executor's **peak** RSS is its ``VmHWM`` (/proc/<pid>/status) after it, **time** is start →
Verifying (s), and the stored blob's sha256 is checked against what the tool printed. A bounded
executor shows peak − idle independent of N.

    python bench/tool_output_rss.py [--sizes-mb 0,1,10,50,200] [--executor-repo PATH]

``--executor-repo``: run the executor from another checkout (e.g. one before the output limits,
to compare); its output is then checked the same way (a silent cut shows as ``MISMATCH``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the tests' printing tool

from _bench_common import Bench, bench_server, console, machine_note, namespace  # noqa: E402
from rich.table import Table  # noqa: E402

from shared.core.fold import RunState  # noqa: E402
from shared.core.workflow import parse_workflow  # noqa: E402
from shared.nats.blobstore import JetStreamBlobStore  # noqa: E402
from shared.nats.client import ReelClient  # noqa: E402
from tests.support import print_bytes  # noqa: E402

PRINTER = REPO / "tests" / "support" / "print_bytes.py"
CAP = 256 * 1024 * 1024
MB = 1_000_000


def _status_mb(pid: int, field: str) -> float:
    """A ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``) in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / MB
    raise KeyError(field)


@contextlib.asynccontextmanager
async def executor_process(b: Bench, repo: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A separate executor process (the code of checkout ``repo``) on ``b``'s namespace; SIGTERM on exit."""
    env = {**os.environ, "NATS_URL": b.cfg.nats_url, "REEL_NAMESPACE": b.cfg.names.namespace,
           "REEL_TOOL_MAX_OUTPUT_BYTES": str(CAP), "REEL_LOG_FORMAT": "json", "PYTHONPATH": str(repo)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "services.executor", cwd=repo, env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
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


async def _run(client: ReelClient, name: str, tool: dict[str, object]) -> tuple[RunState, float]:
    t0 = time.monotonic()
    started = await client.start(parse_workflow({"name": name, "steps": [{"kind": "tool", "id": "dump",
                                                                           "tool": tool}]}), timeout_s=60)
    assert started.ok and started.run_id, started
    state = await client.wait_for(started.run_id, ("verifying",), timeout_s=900)
    return state, time.monotonic() - t0


async def one_size(b: Bench, n_bytes: int, repo: Path) -> tuple[float, float, float, bool]:
    """Idle RSS (MB), peak RSS (MB), time (s) and "sha256 matches" for one tool printing ``n_bytes``."""
    blobs = JetStreamBlobStore(b.nc, b.infra.blobs, b.cfg.names.blob_bucket)
    client = ReelClient(b.nc, b.cfg, blobs)
    async with executor_process(b, repo) as proc:
        await _run(client, "warm", {"type": "recorded", "output": "warm"})
        idle = _status_mb(proc.pid, "VmRSS")
        state, took = await _run(client, "big", {"type": "command", "argv": [sys.executable, str(PRINTER),
                                                                             str(n_bytes)], "timeout_s": 900})
        peak = _status_mb(proc.pid, "VmHWM")
    (a,) = state.branches["main"].attempts["dump"]
    assert a.status == "succeeded" and a.output_ref is not None, a
    size = await blobs.get_file(a.output_ref, None)  # streamed back; raises BlobCorrupt unless it hashes to its ref
    ok = (size, a.output_ref.sha256) == (n_bytes, print_bytes.sha256_of(n_bytes))
    return idle, peak, took, ok


async def main(sizes_mb: list[int], repo: Path) -> None:
    table = Table(title="executor peak RSS vs tool output size (fresh executor process per row)")
    for col in ("output (MB)", "idle RSS (MB)", "peak RSS (MB)", "peak − idle (MB)", "start → verifying (s)",
                "MB/s", "blob sha256"):
        table.add_column(col, justify="right")
    async with bench_server() as srv:
        for i, mb in enumerate(sizes_mb):
            async with namespace(srv, f"rss{i}") as b:
                idle, peak, took, ok = await one_size(b, mb * MB, repo)
            table.add_row(str(mb), f"{idle:.1f}", f"{peak:.1f}", f"{peak - idle:.1f}", f"{took:.2f}",
                          f"{mb / took:.0f}" if mb else "-", "ok" if ok else "MISMATCH")
    console.print(table)
    console.print(f"executor code: {repo}; " + machine_note())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default="0,1,10,50,200")
    parser.add_argument("--executor-repo", type=Path, default=REPO)
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes_mb.split(",")], args.executor_repo.resolve()))
