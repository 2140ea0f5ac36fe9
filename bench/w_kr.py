"""Reel on W(K, R) beside raw JetStream publishes and (with ``--peers``) LangGraph and Restate.

W(K, R) as ../shared/peers/README.md defines it: R runs of K sequential steps, each a no-op returning
a ~200-byte dict that must be durable before the next step starts. (a) R=1, K=200: the median
interval between successive step starts (µs) and wall/K; (b) R=50, K=20: steps/s from the first
start to the last finish.

Reel is driven as a user drives it: an embedded nats-server (file storage, R1) started here, the
executor and the verifier as separate processes (``python -m reel.services.executor`` /
``reel.services.verifier``), every run started by a ``StartRun`` on ``reel.cmd.start`` with one
``output_regex`` verifier, finished when the verifier commits ``run_completed``. Variants:

* ``tool``: K tool steps of type ``recorded`` (plain tool steps have no in-process Python kind;
  ``recorded`` is the no-op one), each returning its own 200-byte dict;
* ``model``: K ``scripted`` model steps (a one-line prompt each, the dict as the answer);
* ``agent``: one agent step of K scripted turns, each calling a no-op async Python tool once
  (bench/_wkr_tools.py, returning the dict), then a final answer: a step is one turn + its call;
* ``tool_always``: ``tool`` on a second server with ``jetstream { sync_interval: always }``.

Step starts are the server's stored timestamps of the commits carrying each step's intent (see
bench/_wkr_reel.py). Every round also measures raw acked publishes on both servers
(bench/_wkr_peers.py, bench_nats.py's method) and, with ``--peers DIR``, one repetition each of
LangGraph (SqliteSaver, durability sync) and Restate, from DIR; the variants' order rotates per
round. Ratios are medians of per-round ratios. It also prints CPU µs per step of every process
(executor, verifier, nats-server, this driver), messages stored per step by stream, and a long
run's (``--long``, 10,000 steps) cost of its first vs its last 1,000 steps, and (``--scale``)
500 runs of 3 steps started at once with 1, 2 and 4 executor processes (three servers up together,
measured in turn): end-to-end time and CPU per step of all processes.

Usage: ``python bench/w_kr.py [--peers ../shared/peers] [--rounds 5] [--long 10000] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _bench_common import machine_note
from _wkr_peers import PEERS, Sample, ensure_raw_stream, median_interval_us, raw_a, raw_b, run_peer
from _wkr_reel import REPO, WORKFLOWS, Stack, reel_stack
from _wkr_report import print_report

REEL_VARIANTS = {"tool": ("default", "tool"), "model": ("default", "model"), "agent": ("default", "agent"),
                 "tool_always": ("always", "tool")}
RAW_VARIANTS = {"raw": "default", "raw_always": "always"}


class Bench:
    """The run's stacks, counters and every sample taken, by variant."""

    def __init__(self, args: argparse.Namespace, stacks: dict[str, Stack], workdir: Path) -> None:
        self.args, self.stacks, self.workdir = args, stacks, workdir
        self.session = uuid.uuid4().hex[:8]
        self.run_no = 0
        self.a: dict[str, list[Sample]] = defaultdict(list)
        self.b: dict[str, list[Sample]] = defaultdict(list)
        self.cpu: dict[str, list[dict[str, float]]] = defaultdict(list)  # "<variant> a|b" → µs/step by process
        self.msgs: dict[str, list[dict[str, float]]] = defaultdict(list)  # "<variant> a|b" → per step by stream
        self.failures: list[str] = []

    def _next(self, n: int = 1) -> int:
        self.run_no += n
        return self.run_no - n

    async def _metered(self, key: str, stack: Stack, steps: int, work: Callable[[], Awaitable[Any]]) -> Any:
        c0, m0 = stack.cpu(), await stack.seqs()
        out = await work()
        c1, m1 = stack.cpu(), await stack.seqs()
        self.cpu[key].append({r: (c1[r] - c0[r]) * 1e6 / steps for r in c0})
        self.msgs[key].append({s: (m1.get(s, 0) - m0.get(s, 0)) / steps for s in m1 if m1.get(s, 0) != m0.get(s, 0)})
        return out

    async def reel(self, variant: str, *, ka: int, rb: int, kb: int, record: bool = True) -> None:
        """(a) then (b) of one Reel variant (``<variant>@base``: on the ``--baseline`` code's stack)."""
        name, _, base = variant.partition("@")
        sync, kind = REEL_VARIANTS[name]
        stack, build = self.stacks[sync + ("@base" if base else "")], WORKFLOWS[kind]
        n = self._next()
        spec = build(n, ka)
        key = f"{self.session}-{variant}-{n}"
        run_id, t0, t1 = await self._metered(f"{variant} a", stack, ka, lambda: stack.run(spec, key))
        starts = await stack.step_starts(run_id, kind)
        assert len(starts) == ka + (kind == "agent"), (variant, len(starts))
        a = Sample(a_median_us=median_interval_us(starts), a_wall_us=(t1 - t0) / 1000 / ka)
        base = self._next(rb)
        specs = [build(base + i, kb) for i in range(rb)]

        async def many() -> list[tuple[str, int, int]]:
            return await asyncio.gather(*(stack.run(s, f"{self.session}-{variant}-{base + i}")
                                          for i, s in enumerate(specs)))

        done = await self._metered(f"{variant} b", stack, rb * kb, many)
        wall_s = (max(t for _, _, t in done) - min(t for _, t, _ in done)) / 1e9
        if record:
            self.a[variant].append(a)
            self.b[variant].append(Sample(b_steps_per_s=rb * kb / wall_s))
        else:  # warm-up: drop its meters
            for key_ in (f"{variant} a", f"{variant} b"):
                self.cpu[key_].pop()
                self.msgs[key_].pop()

    async def raw(self, variant: str, *, ka: int, rb: int, kb: int) -> None:
        js = self.stacks[RAW_VARIANTS[variant]].infra.js
        self.a[variant].append(await raw_a(js, self._next(), ka))
        self.b[variant].append(await raw_b(js, self._next(rb), rb, kb))

    async def peer(self, name: str) -> None:
        a = self.args
        got = await run_peer(name, Path(a.peers), Path(a.peer_venvs), self.workdir, ka=a.ka, rb=a.rb, kb=a.kb)
        if isinstance(got, str):
            self.failures.append(got)
            return
        self.a[name].append(got[0])
        self.b[name].append(got[1])

    async def long_run(self, k: int) -> dict[str, float]:
        """One ``k``-step tool run: mean and median µs/step over its first and last 1,000 steps."""
        stack = self.stacks["default"]
        spec = WORKFLOWS["tool"](self._next(), k)
        run_id, t0, t1 = await self._metered("long", stack, k, lambda: stack.run(spec, f"{self.session}-long",
                                                                                  timeout_s=1200))
        starts = await stack.step_starts(run_id)
        w = min(1000, len(starts) // 2)
        first, last = starts[:w + 1], starts[-(w + 1):]
        return {"steps": k, "window": w, "wall_us_per_step": (t1 - t0) / 1000 / k,
                "first_mean_us": (first[-1] - first[0]) / 1000 / w, "last_mean_us": (last[-1] - last[0]) / 1000 / w,
                "first_median_us": median_interval_us(first), "last_median_us": median_interval_us(last)}


async def scale(args: argparse.Namespace, workdir: str) -> list[dict[str, float]]:
    """``--scale`` runs of 3 tool steps, all started at once, on servers with 1, 2, 4… executors (all up
    together, measured in turn for ``--scale-rounds`` rounds, the order rotating; medians): wall time
    from the first start to the last ``run_completed``, and CPU µs per step of every process. With
    ``--baseline`` each count also runs on the baseline code (rows ``code: baseline``), and with several
    ``--scale-partitions`` on each partition count, all in the same rounds."""
    counts = [int(x) for x in args.scale_executors.split(",")]
    parts = [int(x) for x in str(args.scale_partitions).split(",")]
    trees = [("", REPO)] + ([("@base", Path(args.baseline))] if args.baseline else [])
    keys = [(n, t, p) for n in counts for t, _ in trees for p in parts]
    repo_of = dict(trees)
    samples: dict[tuple[int, str, int], list[dict[str, float]]] = {k: [] for k in keys}
    async with contextlib.AsyncExitStack() as stack_of:
        stacks = {(n, t, p): await stack_of.enter_async_context(reel_stack(
                      "default", workdir, args.concurrency, executors=n, partitions=p, repo=repo_of[t]))
                  for n, t, p in keys}
        tag = uuid.uuid4().hex[:6]
        for (n, t, p), st in stacks.items():
            warm = [WORKFLOWS["tool"](i, 3) for i in range(10 * n)]
            await asyncio.gather(*(st.run(w, f"warm-{tag}-{n}{t}-{p}-{i}") for i, w in enumerate(warm)))
        for r in range(args.scale_rounds):
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                st = stacks[key]
                specs = [WORKFLOWS["tool"](i, 3) for i in range(args.scale)]
                c0 = st.cpu()
                done = await asyncio.gather(*(st.run(w, f"scale-{tag}-{r}-{i}", timeout_s=600)
                                              for i, w in enumerate(specs)))
                c1 = st.cpu()
                steps = 3 * args.scale
                wall = (max(t1 for _, _, t1 in done) - min(t0 for _, t0, _ in done)) / 1e9
                cpu = {role: (c1[role] - c0[role]) * 1e6 / steps for role in c0}
                samples[key].append({
                    "wall_s": wall, "steps_per_s": steps / wall, "cpu_us_per_step": sum(cpu.values()),
                    "executors_cpu_us_per_step": sum(v for role, v in cpu.items() if role.startswith("executor")),
                    "verifier_cpu_us_per_step": cpu["verifier"], "server_cpu_us_per_step": cpu["nats-server"],
                    "driver_cpu_us_per_step": cpu["driver"]})
                print(f"scale round {r + 1}/{args.scale_rounds}, {key[0]} executors{key[1]}, {key[2]} partitions: "
                      f"{wall:.1f} s", file=sys.stderr)
    return [{"executors": n, "code": ("baseline" if t else "this") + (f", {p} partitions" if len(parts) > 1 else ""),
             "partitions": p, "runs": args.scale, "rounds": args.scale_rounds,
             **{k: statistics.median(x[k] for x in xs) for k in xs[0]}} for (n, t, p), xs in samples.items()]


def ratio(bench: Bench, num: str, den: str, phase: str = "a") -> float:
    """Median over rounds of ``num``/``den`` (phase ``a``: µs/step; ``b``: steps/s)."""
    xs, ys = (bench.a if phase == "a" else bench.b)[num], (bench.a if phase == "a" else bench.b)[den]
    vals = [(x.a_median_us / y.a_median_us) if phase == "a" else (x.b_steps_per_s / y.b_steps_per_s)
            for x, y in zip(xs, ys, strict=False)]
    vals = [v for v in vals if not math.isnan(v)]
    return statistics.median(vals) if vals else float("nan")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    load0 = machine_note()
    peers = list(PEERS) if args.peers else []
    with contextlib.nullcontext(args.workdir) if args.workdir else tempfile.TemporaryDirectory(prefix="w_kr-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack_of:
            wanted = [] if args.only_scale else ["default", "always"]
            trees = [("", REPO)] + ([("@base", Path(args.baseline))] if args.baseline else [])
            stacks = {sync + t: await stack_of.enter_async_context(reel_stack(sync, tmp, args.concurrency, repo=repo))
                      for sync in wanted for t, repo in trees if not t or sync != "always" or
                      "tool_always" in args.variants}
            for s in stacks.values():
                await ensure_raw_stream(s.infra.js)
            bench = Bench(args, stacks, workdir)
            reel = [v for v in REEL_VARIANTS if v in args.variants.split(",")] if not args.only_scale else []
            reel = [v + t for v in reel for t, _ in trees]
            for v in reel:  # warm-up: one 20-step run and 5 × 5 concurrent, as the peers do
                await bench.reel(v, ka=20, rb=5, kb=5, record=False)
            jobs: list[tuple[str, Callable[[], Awaitable[None]]]] = []
            for v in RAW_VARIANTS if stacks else ():
                jobs.append((v, lambda v=v: bench.raw(v, ka=args.ka, rb=args.rb, kb=args.kb)))
            for v in reel:
                jobs.append((v, lambda v=v: bench.reel(v, ka=args.ka, rb=args.rb, kb=args.kb)))
            for p in peers:
                jobs.append((p, lambda p=p: bench.peer(p)))
            for r in range(args.rounds if jobs else 0):
                for name, job in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
                    t = time.monotonic()
                    await job()
                    print(f"round {r + 1}/{args.rounds} {name}: {time.monotonic() - t:.1f} s", file=sys.stderr)
            long = await bench.long_run(args.long) if args.long and stacks else None
        scaled = await scale(args, tmp) if args.scale else []
        return print_report(bench, long, scaled, load0=load0, load1=machine_note(),
                            elapsed_s=time.monotonic() - started, ratio=ratio, peers=bool(peers))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--peers", help="the peers' folder (../shared/peers, built by its setup.sh)")
    ap.add_argument("--peer-venvs", default=os.environ.get("PEERS_VENVS", "/tmp/peersvenv"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ka", type=int, default=200)
    ap.add_argument("--rb", type=int, default=50)
    ap.add_argument("--kb", type=int, default=20)
    ap.add_argument("--long", type=int, default=10_000, help="steps of the long run (0: skip)")
    ap.add_argument("--scale", type=int, default=500, help="runs of 3 steps started at once (0: skip)")
    ap.add_argument("--scale-executors", default="1,2,4", help="executor processes of the --scale servers")
    ap.add_argument("--scale-rounds", type=int, default=3)
    ap.add_argument("--scale-partitions", default="4",
                    help="REEL_PARTITIONS of the --scale servers, dealt round-robin (0: one shared durable); "
                         "several, comma-separated: each measured in the same rounds")
    ap.add_argument("--concurrency", type=int, default=50, help="REEL_MAX_CONCURRENT_RUNS of each executor")
    ap.add_argument("--variants", default=",".join(REEL_VARIANTS), help="Reel variants, comma-separated")
    ap.add_argument("--baseline", help="another checkout of Reel (e.g. a git worktree of an earlier commit): its "
                    "services run beside this tree's, on their own servers, in the same rounds (variants <v>@base)")
    ap.add_argument("--only-scale", action="store_true", help="only the --scale section")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--workdir", help="keep the servers' stores and the services' logs here (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.peers:  # the peers run in their folder: a relative path would name their scripts twice relative
        args.peers = str(Path(args.peers).resolve())
    return args


if __name__ == "__main__":
    ARGS = parse()
    RESULT = asyncio.run(main(ARGS))
    if ARGS.json:
        Path(ARGS.json).write_text(json.dumps(RESULT, indent=1, default=str))
