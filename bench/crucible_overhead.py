"""Crucible loop overhead per iteration, excluding proposer and judge time.

Runs real sessions — embedded nats-server (file storage), real git world, trivial
shell proposer and judge — and prints, per scenario, the time of one loop
iteration that is neither the proposer's nor the judge's own wall time: gates,
git stage/commit/ref/rollback, blob put of the patch, the session-log commits
(guarded publish + fold) and the fingerprint check.

Per iteration i: overhead_i = (at_ms of IterationClosed_i − at_ms of IterationClosed_{i−1})
− proposer_ms_i − judge_ms_i (both recorded in the session log; judge_ms_i sums every
measurement of the iteration: a kept candidate's confirmations and incumbent readings too).
``keep`` runs the default confirmation (3 more readings of the candidate, 3 of the
incumbent, each in the clean measure tree); ``keep-1`` the one-reading rule.

    python bench/crucible_overhead.py [--iterations 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from reel.services.crucible.session import backend, start_session
from reel.shared.core.wire.subjects import Names
from reel.shared.crucible.config import parse_config
from reel.shared.crucible.events import IterationClosed, MeasureFinished, ProposalMade, SegmentOpened
from reel.shared.crucible.state import Reading
from reel.shared.nats.embedded import embedded_server
from reel.shared.runtime.config import Config
from reel.shared.runtime.logging import setup_logging

ONE_READING: dict[str, object] = {"confirm_repeats": 0, "remeasure_incumbent": False}
SCENARIOS: dict[str, tuple[str, str, dict[str, object]]] = {
    # name: (proposer shell snippet, description, noise settings)
    "keep": ("echo $CRUCIBLE_ITERATION > value.txt", "every candidate better: confirm (defaults), keep", {}),
    "keep-1": ("echo $CRUCIBLE_ITERATION > value.txt", "every candidate better: one reading, keep",
               ONE_READING),
    "discard": ("echo -$CRUCIBLE_ITERATION > value.txt", "every candidate worse: commit, roll back", {}),
    "skip": ("true", "empty diff: nothing to apply or measure", {}),
}


def make_repo(root: Path) -> Path:
    repo = root / "src"
    repo.mkdir(parents=True)
    (repo / "value.txt").write_text("0\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


async def scenario(cfg: Config, root: Path, name: str, iterations: int) -> dict[str, float]:
    repo = make_repo(root / name)
    config = parse_config({
        "name": f"bench-{name}", "world": {"repo": str(repo), "workdir": str(root / name / "work")},
        "judge": {"command": ["cat", "value.txt"], "direction": "maximize"},
        "proposer": {"command": ["sh", "-c", SCENARIOS[name][0]]},
        "budget": {"iterations": iterations},
        "noise": SCENARIOS[name][2],
    }, config_dir=str(root), cwd=str(root), environ={})
    async with backend(cfg, writer="bench") as b:
        res = await start_session(b, config, stop=asyncio.Event())
        commits = await b.log.read(res.session_id)
    events = [e for _, c in commits for e in c.events]
    opened = next(e for e in events if isinstance(e, SegmentOpened))
    closed = [e for e in events if isinstance(e, IterationClosed)]
    proposer = {e.it: e.proposer_ms for e in events if isinstance(e, ProposalMade)}
    judge: dict[int, int] = {}
    for e in events:
        if isinstance(e, MeasureFinished):  # a kept candidate's confirmations and incumbent readings too
            judge[e.it] = judge.get(e.it, 0) + e.reading.judge_ms
    overhead, cycle = [], []
    prev = opened.at_ms
    for e in closed:
        it = e.row.it
        span = e.at_ms - prev
        prev = e.at_ms
        cycle.append(span)
        overhead.append(span - proposer.get(it, 0) - judge.get(it, 0))
    n = len(closed)
    return {
        "iterations": n,
        "commits_per_it": (len(commits) - 3) / n,  # minus SessionStarted, the baseline, SessionEnded
        "cycle_ms": statistics.fmean(cycle),
        "proposer_ms": statistics.fmean(proposer.values()) if proposer else 0.0,
        "judge_ms": statistics.fmean(judge.values()) if judge else 0.0,
        "overhead_ms": statistics.fmean(overhead),
        "p50_ms": statistics.median(overhead),
        "p95_ms": sorted(overhead)[max(0, int(0.95 * n) - 1)],
    }


async def commit_ms(cfg: Config, n: int = 200) -> float:
    """Mean latency of one guarded session-log commit (one ``measured`` event), ms."""
    async with backend(cfg, writer="bench") as b:
        event = MeasureFinished(it=1, reading=Reading(values=(1.0,), score=1.0, total=10), at_ms=0)
        lsn = 0
        t0 = time.perf_counter()
        for _ in range(n):
            lsn, _ = await b.log.append("commit-bench", [event], expected_lsn=lsn)
        return (time.perf_counter() - t0) * 1000 / n


async def main(iterations: int) -> None:
    with tempfile.TemporaryDirectory(prefix="crucible-bench-") as tmp:
        async with embedded_server() as srv:
            cfg = Config(nats_url=srv.url, names=Names(f"b{uuid.uuid4().hex[:8]}"))
            results = {name: await scenario(cfg, Path(tmp), name, iterations) for name in SCENARIOS}
            one_commit = await commit_ms(cfg)
    t = Table(title=f"Crucible loop overhead per iteration (excl. proposer and judge), {iterations} iterations, "
                    "embedded nats-server, file storage")
    for col in ("scenario", "what", "commits/it", "cycle ms", "proposer ms", "judge ms", "overhead ms (mean)",
                "p50", "p95"):
        t.add_column(col, justify="left" if col in ("scenario", "what") else "right")
    for name, r in results.items():
        t.add_row(name, SCENARIOS[name][1], f"{r['commits_per_it']:.1f}", f"{r['cycle_ms']:.1f}",
                  f"{r['proposer_ms']:.1f}", f"{r['judge_ms']:.1f}", f"{r['overhead_ms']:.1f}",
                  f"{r['p50_ms']:.0f}", f"{r['p95_ms']:.0f}")
    Console(width=160).print(t)
    Console(width=160).print(f"one guarded session-log commit: {one_commit:.2f} ms (mean of 200); "
                             f"python {sys.version.split()[0]}; times from the session log")


if __name__ == "__main__":
    setup_logging("bench", level="WARNING")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40)
    asyncio.run(main(parser.parse_args().iterations))
