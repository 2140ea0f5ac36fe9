"""A thousand live agents: N concurrent agent runs against a loopback chat-completions model, on 1, 2 and 4 executors.

Each run is one agent step of ``--turns`` K model turns (an ``openai`` model, ``stream: true``, at the
loopback server of bench/_live_server.py in a child process): turns 1…K−1 each call the async Python tool
``bench._wkr_tools:noop`` once, turn K answers; one regex verifier. Every answer takes ``--latency`` s
(default 1 s, streamed in ``--chunks`` chunks). The N runs are started at once (``reel.cmd.start``, keyed)
on a stack of bench/_wkr_reel.py: an embedded nats-server, the executors and one verifier as their own
processes. Variants, one after the other in one invocation, each on a fresh server:

* ``model only`` (the baseline): the same N × K calls from this process (aiohttp, one session, N at once,
  each run's calls in sequence, the same script) — the load with the model latency alone;
* ``defaults``: one executor with no ``REEL_MAX_CONCURRENT_RUNS`` / ``REEL_PARTITIONS`` set;
* ``defaults @REV`` (``--baseline REV``): the same, the services run from git revision REV of this
  repository (``git archive``): a before beside the after, in one invocation;
* ``E exec, P parts`` for each E of ``--executors`` with ``--partitions`` P (dealt round-robin).

Per variant: time to drain (first start sent → last ``run_completed`` seen, s) and its ratio to the
baseline's; the executors' CPU per turn (ms, ``/proc/<pid>/task/*/schedstat`` over the load ÷ N·K, all
executors summed); Reel's overhead per turn, p50 / p99 (ms): a turn's wall time (from the end of the
previous answer, or the start command, to the end of its own answer, or the ``run_completed`` commit for
the last turn) minus the model's time for it as the server measured it; the executors' RSS (MB, summed)
idle before the load (after a warm-up of 8 runs), at its peak, and after the drain (``--settle`` s later),
and the peak's growth per live run (KB). The nats-server's and the verifier's CPU are shown for context.

Usage: ``python bench/live_agents.py [--runs 1000] [--turns 5] [--latency 1] [--executors 1,2,4]
[--partitions 4] [--no-defaults]``; last lines: ``ratio drain_vs_model_only <variant>=<x>`` and
``ratio cpu_per_turn <E> exec / 1 exec=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _bench_common import machine_note, pct
from _wkr_reel import NOOP_TOOL, REPO, Stack, reel_stack
from nats.aio.msg import Msg

from reel.shared.core.run.ids import run_id_for_key
from reel.shared.core.workflow.spec import AgentStep, ContextItemSpec, ModelSpec, VerifierSpec, WorkflowSpec
from reel.shared.nats.client import CommandTimeout
from reel.shared.runtime.config import DEFAULT_PARTITIONS

HERE = Path(__file__).resolve().parent
WARMUP_RUNS = 8
STALL_S = 60.0
VERIFIER = VerifierSpec(type="output_regex", name="done", pattern="finished after [0-9]+ turns")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def chat_server(latency_s: float, chunks: int, turns: int) -> AsyncIterator[str]:
    """The loopback model (bench/_live_server.py) in a child process: its ``/v1`` base URL."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, str(HERE / "_live_server.py"), str(port),
                                                str(latency_s), str(chunks), str(turns))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        await proc.wait()


async def server_calls(session: aiohttp.ClientSession, base: str) -> dict[tuple[int, int], tuple[float, float]]:
    """(run, turn) → (arrived, done) of every answer the server gave since the last read (Unix s)."""
    async with session.get(base.removesuffix("/v1") + "/stats") as resp:
        calls = (await resp.json())["calls"]
    return {(int(r), int(t)): (a, d) for r, t, a, d in calls}


def workflow(base_url: str, run: int, turns: int) -> WorkflowSpec:
    """One agent step of ``turns`` turns against the loopback model; ``live-run:<run>`` names the run to it."""
    model = ModelSpec(adapter="openai", base_url=base_url, model="loopback", stream=True, timeout_s=300.0)
    agent = AgentStep(id="a", max_turns=turns, instructions="Call noop until told you are done.",
                      tools=(NOOP_TOOL,), model=model,
                      context=(ContextItemSpec(id="task", kind="task", text=f"live-run:{run} call the tool"),))
    return WorkflowSpec(name=f"live-agent-{run}", steps=(agent,), verifiers=(VERIFIER,))


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` (MB, ``VmRSS``); NaN once it is gone or off Linux."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


@dataclass
class Result:
    """What one variant measured (see the module doc)."""

    name: str
    drain_s: float
    overhead_ms: list[float]
    cpu_ms_per_turn: float = float("nan")
    nats_ms_per_turn: float = float("nan")
    verifier_ms_per_turn: float = float("nan")
    rss_idle: float = float("nan")
    rss_peak: float = float("nan")
    rss_after: float = float("nan")
    failed: int = 0
    notes: list[str] = field(default_factory=list)


def overheads(starts: dict[int, float], ends: dict[int, float], calls: dict[tuple[int, int], tuple[float, float]],
              turns: int) -> list[float]:
    """Per turn of every finished run: wall minus the model's time (ms), the boundaries of the module doc."""
    out = []
    for run, t0 in starts.items():
        if run not in ends or any((run, t) not in calls for t in range(1, turns + 1)):
            continue
        prev = t0
        for t in range(1, turns + 1):
            arrived, done = calls[(run, t)]
            end = ends[run] if t == turns else done
            out.append((end - prev - (done - arrived)) * 1000)
            prev = end
    return out


async def model_only(base: str, runs: int, turns: int) -> Result:
    """The baseline: each run's K calls in sequence from this process, the N runs at once (see module doc)."""
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await server_calls(session, base)
        starts: dict[int, float] = {}
        ends: dict[int, float] = {}

        async def one(run: int) -> None:
            messages: list[dict[str, Any]] = [{"role": "system", "content": "Call noop until told you are done."},
                                              {"role": "user", "content": f"live-run:{run} call the tool"}]
            starts[run] = time.time()
            for t in range(1, turns + 1):
                body = {"model": "loopback", "messages": messages, "stream": True,
                        "stream_options": {"include_usage": True}}
                async with session.post(base + "/chat/completions", json=body) as resp:
                    async for _ in resp.content:
                        pass
                if t < turns:
                    messages = [*messages, {"role": "assistant", "content": None},
                                {"role": "tool", "tool_call_id": f"c{t}", "content": "{}"}]
            ends[run] = time.time()

        t0 = time.time()
        await asyncio.gather(*(one(i) for i in range(runs)))
        drain = max(ends.values()) - t0
        calls = await server_calls(session, base)
    return Result("model only (baseline)", drain, overheads(starts, ends, calls, turns))


class Completions:
    """Core subscription on ``reel.ev.*``: when (Unix s) each run's ``run_completed`` arrived, and its outcome."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.passed: dict[str, bool] = {}
        self.all_done: asyncio.Event = asyncio.Event()
        self.expect: set[str] = set()

    async def on_commit(self, msg: Msg) -> None:
        if b'"run_completed"' not in msg.data:
            return
        run_id = msg.subject.rsplit(".", 1)[-1]
        self.at.setdefault(run_id, time.time())
        self.passed[run_id] = b'"outcome":"passed"' in msg.data
        if self.expect and self.expect <= self.at.keys():
            self.all_done.set()


async def drive(stack: Stack, base: str, keys: list[str], runs: list[int], turns: int, done: Completions
                ) -> dict[int, float]:
    """Start one run per key at once; wait until every one completed: start times (Unix s) by run number."""
    ids = {run_id_for_key(k): r for k, r in zip(keys, runs, strict=True)}
    done.expect, done.all_done = set(ids), asyncio.Event()
    starts: dict[int, float] = {}

    async def start(key: str, run: int) -> None:
        starts[run] = time.time()
        for _ in range(5):  # a refusal that says to retry (an executor that lost its lease): as a user would
            try:
                reply = await stack.client.start(workflow(base, run, turns), idempotency_key=key, timeout_s=300)
            except CommandTimeout:
                break
            if reply.ok:
                return
            print(f"start {key} refused: {reply.error}", file=sys.stderr)
            await asyncio.sleep(1.0)
        done.expect.discard(run_id_for_key(key))

    await asyncio.gather(*(start(k, r) for k, r in zip(keys, runs, strict=True)))
    if done.expect <= done.at.keys():
        done.all_done.set()
    seen = -1
    while not done.all_done.is_set() and len(done.at) > seen:  # give up after a minute without a completion
        seen = len(done.at)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.all_done.wait(), STALL_S)
    return starts


async def reel_variant(name: str, base: str, args: argparse.Namespace, workdir: str, executors: int,
                       partitions: int | None, concurrency: int | None, repo: Path = REPO) -> Result:
    async with contextlib.AsyncExitStack() as es:
        stack = await es.enter_async_context(reel_stack("default", workdir, concurrency, executors, partitions,
                                                        repo=repo))
        done = Completions()
        await stack.client.nc.subscribe(stack.cfg.names.events("*"), cb=done.on_commit)
        session = await es.enter_async_context(aiohttp.ClientSession())
        execs = [p.pid for role, p in stack.procs.items() if role.startswith("executor")]
        tag = uuid.uuid4().hex[:8]
        await drive(stack, base, [f"warm-{tag}-{i}" for i in range(WARMUP_RUNS)],
                    [10_000_000 + i for i in range(WARMUP_RUNS)], args.turns, done)
        await asyncio.sleep(1.0)
        await server_calls(session, base)
        idle = sum(rss_mb(p) for p in execs)
        peak = idle
        sampling = True

        async def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, sum(rss_mb(p) for p in execs))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        spies = [await asyncio.create_subprocess_exec(
            "py-spy", "record", "--nonblocking", "-r", "50", "-f", "raw", "-p", str(pid),
            "-o", f"{args.profile}/{name.split(',')[0].replace(' ', '')}-{i}.txt",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            for i, pid in enumerate(execs)] if args.profile else []
        cpu0 = stack.cpu()
        t0 = time.time()
        keys = [f"live-{tag}-{i}" for i in range(args.runs)]
        starts = await drive(stack, base, keys, list(range(args.runs)), args.turns, done)
        drain = max(done.at.get(run_id_for_key(k), 0.0) for k in keys) - t0
        cpu1 = stack.cpu()
        for spy in spies:
            spy.send_signal(2)
            await spy.wait()
        sampling = False
        await sampler
        await asyncio.sleep(args.settle)
        after = sum(rss_mb(p) for p in execs)
        calls = await server_calls(session, base)
        ends = {r: done.at[run_id_for_key(k)] for r, k in enumerate(keys) if run_id_for_key(k) in done.at}
        failed = sum(1 for k in keys if not done.passed.get(run_id_for_key(k), False))
        n_turns = args.runs * args.turns

        def per_turn(roles: list[str]) -> float:
            return sum(cpu1[r] - cpu0[r] for r in roles) * 1000 / n_turns

        roles = [r for r in cpu0 if r.startswith("executor")]
        return Result(name, drain, overheads(starts, ends, calls, args.turns), cpu_ms_per_turn=per_turn(roles),
                      nats_ms_per_turn=per_turn(["nats-server"]), verifier_ms_per_turn=per_turn(["verifier"]),
                      rss_idle=idle, rss_peak=peak, rss_after=after, failed=failed)
    raise AssertionError("unreachable")


def report(results: list[Result], args: argparse.Namespace, load0: str, load1: str) -> None:
    print(f"live agents: {args.runs} runs at once × {args.turns} turns ({args.turns - 1} tool calls), model "
          f"{args.latency:g} s per answer streamed in {args.chunks} chunks")
    print(f"before: {load0}\nafter:  {load1}")
    head = (f"{'variant':<24}{'drain s':>9}{'÷ model':>9}{'exec CPU':>10}{'ovh p50':>9}{'ovh p99':>9}"
            f"{'RSS idle':>10}{'peak':>8}{'after':>8}{'KB/run':>8}{'nats CPU':>10}{'verif CPU':>10}{'failed':>8}")
    print(head)
    print(f"{'':<24}{'':>9}{'':>9}{'ms/turn':>10}{'ms':>9}{'ms':>9}{'MB':>10}{'MB':>8}{'MB':>8}{'':>8}"
          f"{'ms/turn':>10}{'ms/turn':>10}")
    base = results[0]
    for r in results:
        per_run = (r.rss_peak - r.rss_idle) * 1024 / args.runs
        print(f"{r.name:<24}{r.drain_s:>9.1f}{r.drain_s / base.drain_s:>9.2f}{r.cpu_ms_per_turn:>10.2f}"
              f"{pct(r.overhead_ms, 50):>9.0f}{pct(r.overhead_ms, 99):>9.0f}{r.rss_idle:>10.0f}{r.rss_peak:>8.0f}"
              f"{r.rss_after:>8.0f}{per_run:>8.0f}{r.nats_ms_per_turn:>10.2f}{r.verifier_ms_per_turn:>10.2f}"
              f"{r.failed:>8}")
    for r in results[1:]:
        print(f"ratio drain_vs_model_only {r.name.replace(' ', '_')}={r.drain_s / base.drain_s:.2f}")
    scaled = [r for r in results if re.match(r"\d+ exec", r.name)]
    if scaled:
        one = scaled[0]
        for r in scaled[1:]:
            print(f"ratio cpu_per_turn {r.name.split(',')[0]} / {one.name.split(',')[0]}="
                  f"{r.cpu_ms_per_turn / one.cpu_ms_per_turn:.2f} drain={r.drain_s / one.drain_s:.2f}")


async def main(args: argparse.Namespace) -> None:
    load0 = machine_note()
    results: list[Result] = []
    with contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(prefix="live-agents-") as tmp:
        async with chat_server(args.latency, args.chunks, args.turns) as base:
            results.append(await model_only(base, args.runs, args.turns))
            print(f"model only: {results[-1].drain_s:.1f} s", file=sys.stderr)
            variants: list[tuple[str, int, int | None, int | None, Path]] = []
            if args.baseline:
                variants.append((f"defaults @{args.baseline}", 1, None, None, baseline_tree(args.baseline, Path(tmp))))
            if not args.no_defaults:
                variants.append((f"defaults (1 exec, {DEFAULT_PARTITIONS} parts)", 1, None, None, REPO))
            for e in args.executors:
                variants.append((f"{e} exec, {args.partitions} parts", e, args.partitions, args.concurrency, REPO))
            for i, (name, e, parts, conc, repo) in enumerate(variants):
                d = tempfile.mkdtemp(prefix=f"v{i}-", dir=tmp)
                results.append(await reel_variant(name, base, args, d, e, parts, conc, repo))
                print(f"{name}: {results[-1].drain_s:.1f} s", file=sys.stderr)
    report(results, args, load0, machine_note())


def baseline_tree(rev: str, into: Path) -> Path:
    """The source tree of git revision ``rev`` of this repository (``git archive``), extracted under ``into``."""
    tree = into / f"reel-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=5, help="model turns per run (the last answers; default 5)")
    ap.add_argument("--latency", type=float, default=1.0, help="seconds per model answer (default 1)")
    ap.add_argument("--chunks", type=int, default=8, help="streamed chunks per answer (default 8)")
    ap.add_argument("--executors", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 2, 4])
    ap.add_argument("--partitions", type=int, default=4, help="REEL_PARTITIONS of the E-executor variants")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="REEL_MAX_CONCURRENT_RUNS of the E-executor variants (default: unset)")
    ap.add_argument("--baseline", default="", help="git revision whose services run a 'defaults' variant too")
    ap.add_argument("--no-defaults", action="store_true", help="skip the one-executor default-settings variant")
    ap.add_argument("--profile", default="", help="py-spy (on PATH) records each executor into this folder")
    ap.add_argument("--keep", default="", help="keep the services' logs in this folder (default: a temp dir)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after the drain before RSS is read")
    return ap.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
