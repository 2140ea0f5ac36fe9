"""Benchmark: the cost of folding ONE new commit into a run's state, at step 10 and at step 10,000.

In memory, no server. For each size N (default 10, 100, 1,000, 10,000) a run is
built the way the executor writes one: ``run_created`` (N + 1 model steps
declared), ``run_started``, then per step an ``attempt_dispatched`` (prompt ref +
context partition) and an ``attempt_succeeded`` (output ref, usage). That is the
state at step N. The timed operation is what a service does after each of its
own commits: ``apply_commit(state, lsn, commit)`` on the state it already holds,

* **dispatch**: the intent of the next step (a new step key on the branch);
* **outcome**: that attempt's success (replaces one attempt record),

for the next :data:`BURST` steps, each commit timed on its own.

Each rep starts from a state folded fresh from the commits (untimed), so a fold
that mutates its state in place is timed on an unchanged state too; a full
``gc.collect()`` (untimed) then ages it as a service's state would be, and the
cyclic GC stays enabled while timing, as in a running service. Figures are the median over ``--reps``
(µs per commit); **ratio** is N = largest ÷ N = smallest: a fold that is O(1)
per commit keeps it near 1. The last columns time the cold fold of the whole run
(GC paused, as ``JetStreamEventLog.load`` does) for the per-commit cost of a full load.

    python bench/fold_step.py [--sizes 10,100,1000,10000] [--reps 200]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

from _bench_common import console, dispatch_event, fake_ref, machine_note, outcome_event
from rich.table import Table

from reel.shared.core.run import fold as folding
from reel.shared.core.run.events import AnyEvent, Commit, RunCreated, RunStarted, StepDecl
from reel.shared.core.run.state import RunState

EXECUTOR = "x-0123456789ab"
T0 = 1_780_000_000_000


BURST = 16
"""Steps whose commits (dispatch + outcome each) are timed per rep, above the state at step N."""


def events_of(k: int) -> list[AnyEvent]:
    """Step ``k``'s dispatch and success."""
    return [dispatch_event(k, 1, EXECUTOR, at_ms=T0 + 10 * k), outcome_event(k, 1, at_ms=T0 + 10 * k + 5)]


def as_commits(events: list[AnyEvent], first_lsn: int) -> list[tuple[int, Commit]]:
    return [(first_lsn + i, Commit(commit_id=f"c{first_lsn + i}", run_id="r-bench", writer=EXECUTOR, events=(e,)))
            for i, e in enumerate(events)]


def run_commits(n_steps: int) -> tuple[list[tuple[int, Commit]], list[tuple[int, Commit]]]:
    """The commits of a run that has completed ``n_steps`` steps, and the :data:`BURST` steps' after them."""
    created = RunCreated(
        run_id="r-bench", branch_id="main", workflow_name="bench-fold-step",
        workflow_ref=fake_ref("workflow", 40_000, "application/json"),
        steps=tuple(StepDecl(step_id=f"s{k:05d}", kind="model", max_attempts=3) for k in range(n_steps + BURST)),
        verifiers=("output_regex",), created_ms=T0 - 1000, labels={"bench": "fold_step"},
    )
    events: list[AnyEvent] = [created, RunStarted(executor_id=EXECUTOR, at_ms=T0 - 500)]
    for k in range(n_steps):
        events.extend(events_of(k))
    head = as_commits(events, 1)
    return head, as_commits([e for k in range(n_steps, n_steps + BURST) for e in events_of(k)], len(head) + 1)


def cold_fold(commits: list[tuple[int, Commit]]) -> RunState:
    gc.disable()
    try:
        state = folding.fold(commits)
    finally:
        gc.enable()
    assert state is not None
    return state


def time_burst(head: list[tuple[int, Commit]], burst: list[tuple[int, Commit]], reps: int) -> dict[str, float]:
    """Median over reps of the mean µs per dispatch and per outcome commit of one burst."""
    samples: dict[str, list[float]] = {"dispatch": [], "outcome": []}
    for _ in range(reps):
        state = cold_fold(head)
        gc.collect()  # a service's state is old by now: the fold's objects moved out of the young generation
        spent = [0, 0]
        for i, (lsn, commit) in enumerate(burst):
            t = time.perf_counter_ns()
            state = folding.apply_commit(state, lsn, commit)
            spent[i % 2] += time.perf_counter_ns() - t
        samples["dispatch"].append(spent[0] / 1000 / BURST)
        samples["outcome"].append(spent[1] / 1000 / BURST)
    return {k: statistics.median(v) for k, v in samples.items()}


def best_of(fn: Callable[[], object], reps: int) -> float:
    """Fastest wall time of ``fn`` over ``reps`` calls, in ms."""
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[tuple[int, dict[str, float], float, int]] = []
    for n in sizes:
        head, burst = run_commits(n)
        reps = args.reps if n <= 1000 else max(10, args.reps // 5)
        one = time_burst(head, burst, reps)
        full = best_of(partial(cold_fold, head), 5)
        rows.append((n, one, full, len(head)))
        console.print(f"  step {n:,}: done ({reps} reps)")
    table = Table(title=f"Folding one new commit into the state at step N (µs per commit, median of the mean over "
                        f"{BURST} steps); {machine_note()}")
    for col in ("step N", "dispatch (new step)", "outcome", "cold fold of the run (ms)", "cold fold µs/commit"):
        table.add_column(col, justify="right")
    for n, one, full, count in rows:
        table.add_row(f"{n:,}", f"{one['dispatch']:.2f}", f"{one['outcome']:.2f}", f"{full:.1f}",
                      f"{1000 * full / count:.2f}")
    lo, hi = rows[0], rows[-1]
    table.add_row(f"ratio {hi[0]:,} ÷ {lo[0]:,}", *(f"{hi[1][k] / lo[1][k]:.2f}" for k in ("dispatch", "outcome")),
                  "", f"{(hi[2] / hi[3]) / (lo[2] / lo[3]):.2f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
