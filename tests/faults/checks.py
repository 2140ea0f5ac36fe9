"""The invariants every fault scenario checks, counted, then asserted.

A scenario hands :func:`check_runs` the run ids of the starts it saw acked (a repeat of
one idempotency key gives the same id again) and the side-effect file its tools wrote;
the checks wait for every run to rest within a bound (a polling rendezvous,
:func:`tests.integration.scenarios.wait_until`), then count:

* **lost** — an acked start that did not complete exactly once: no run in the log, not
  ``completed`` (when ``expect="completed"``), a branch with two ``run_completed``, or a
  second run carrying the same idempotency key;
* **stuck** — a run not at rest (``completed``/``cancelled``) within ``timeout_s``, or
  resting with an attempt still ``dispatched`` (a superseded or lost attempt nobody resolved);
* **unrecorded** — a side-effect line ``<run>:<step>:<attempt>`` (the tools of
  :func:`side_effect_tool` append one per run) with no such attempt in the run's log;
* **refold** — a run whose materialized state differs from a cold re-fold of its log
  (:func:`tests.refold.assert_refold_identical`).

Usage (record before asserting, so the suite's summary line counts honestly)::

    counts = await check_runs(client.log, run_ids, side_effects=path)
    faults_ledger.record("name", counts.runs, counts.lost, counts.stuck, counts.unrecorded)
    counts.assert_clean()
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from reel.shared.core.errors import RunNotFound
from reel.shared.core.run.events import RunCompleted
from reel.shared.core.run.integrity import RunCorrupt
from reel.shared.core.run.state import CANCELLED, COMPLETED, DISPATCHED, RunState
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.integration.scenarios import wait_until
from tests.refold import assert_refold_identical

REST: frozenset[str] = frozenset({COMPLETED, CANCELLED})
"""Statuses a fault scenario's runs must reach (no executor, verifier or recovery left to act)."""


@dataclass
class FaultCounts:
    """What :func:`check_runs` found; ``problems`` says which run and why, one line each."""

    runs: int = 0
    lost: int = 0
    stuck: int = 0
    unrecorded: int = 0
    refold: int = 0
    side_effects: int = 0
    problems: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        """Raises AssertionError listing every problem, if any count is not zero."""
        assert not (self.lost or self.stuck or self.unrecorded or self.refold), (
            f"{self.runs} runs: {self.lost} lost, {self.stuck} stuck, {self.unrecorded} unrecorded side effects, "
            f"{self.refold} refold mismatches:\n" + "\n".join(self.problems[:50]))


def side_effect_tool(path: Path, output: str = "ok", *, sleep_s: float = 0.0) -> dict[str, Any]:
    """A ``command`` tool spec that appends ``<run>:<step>:<attempt>`` to ``path`` (one ``O_APPEND`` write of a
    short line: atomic between processes), then prints ``output``; ``sleep_s`` first, if set."""
    nap = f"sleep {sleep_s}; " if sleep_s else ""
    script = nap + 'printf "%s:%s:%s\\n" "$REEL_RUN_ID" "$REEL_STEP_ID" "$REEL_ATTEMPT" >> "$1"; printf "%s" "$2"'
    return {"type": "command", "argv": ["sh", "-c", script, "side-effect", str(path), output], "timeout_s": 30}


def read_side_effects(path: Path | None) -> list[str]:
    """The lines of the side-effect file (none if it does not exist)."""
    if path is None or not path.exists():
        return []
    return [ln for ln in path.read_text().splitlines() if ln]


async def _state(log: JetStreamEventLog, run_id: str) -> RunState | RunCorrupt | None:
    try:
        return await log.load(run_id)
    except RunNotFound:
        return None
    except RunCorrupt as exc:
        return exc


def _dispatched(state: RunState) -> list[str]:
    return [f"{b.branch_id}/{step}#{a.attempt}" for b in state.branches.values()
            for step, attempts in b.attempts.items() for a in attempts if a.status == DISPATCHED]


def _at_rest(state: RunState) -> bool:
    return state.status in REST and not _dispatched(state)


async def wait_rest(log: JetStreamEventLog, run_ids: Iterable[str], *, timeout_s: float) -> dict[str, RunState]:
    """Poll until every run is at rest (``completed``/``cancelled``, no attempt dispatched) or ``timeout_s``
    passes; returns the runs that came to rest (their last state read). Never raises on a timeout."""
    pending, done = set(run_ids), {}

    async def check() -> bool:
        for run_id in sorted(pending):
            state = await _state(log, run_id)
            if isinstance(state, RunState) and _at_rest(state):
                done[run_id] = state
                pending.discard(run_id)
        return not pending

    with contextlib.suppress(AssertionError):  # a timeout: the runs not at rest are counted by the caller
        await wait_until(check, timeout_s=timeout_s, what="every run to rest")
    return done


def _completions(commits: Sequence[tuple[int, Any]]) -> Counter[str]:
    return Counter(e.branch_id for _, c in commits for e in c.events if isinstance(e, RunCompleted))


async def check_runs(log: JetStreamEventLog, acked: Iterable[str], *, side_effects: Path | None = None,
                     timeout_s: float = 60.0, expect: Literal["completed", "rest"] = "completed",
                     ignore: Iterable[str] = ()) -> FaultCounts:
    """Wait for the acked runs to rest, then count lost / stuck / unrecorded / refold problems (see module doc).

    Args:
        acked: run ids of acked starts (repeats allowed: one run per idempotency key is expected).
        side_effects: the file :func:`side_effect_tool` appends to (``None``: no side effects checked).
        timeout_s: the bound every run must come to rest within (s, for all runs together).
        expect: ``completed`` (each acked run completes) or ``rest`` (completed or cancelled).
        ignore: runs deliberately corrupted by the scenario: neither counted nor checked (their side-effect
            lines are still matched against the log as of their last good commit).
    """
    ids = sorted(set(acked) - set(ignore))
    counts = FaultCounts(runs=len(ids))
    started = time.monotonic()
    rested = await wait_rest(log, ids, timeout_s=timeout_s)
    for run_id in ids:
        if run_id in rested:
            continue
        state = await _state(log, run_id)
        if state is None:
            counts.lost += 1
            counts.problems.append(f"{run_id}: acked, but no run in the log")
        elif isinstance(state, RunCorrupt):
            counts.lost += 1
            counts.problems.append(f"{run_id}: {state.corruption.describe()}")
        else:
            counts.stuck += 1
            counts.problems.append(f"{run_id}: not at rest after {time.monotonic() - started:.1f}s: "
                                   f"{state.status}, dispatched {_dispatched(state)}")
    for run_id, state in rested.items():
        per_branch = _completions(await log.read(run_id))
        twice = {b: n for b, n in per_branch.items() if n > 1}
        if twice or (state.status == COMPLETED and per_branch[state.active_branch] != 1):
            counts.lost += 1
            counts.problems.append(f"{run_id}: run_completed per branch {dict(per_branch)}")
        elif expect == "completed" and state.status != COMPLETED:
            counts.lost += 1
            counts.problems.append(f"{run_id}: {state.status}, not completed")
        try:
            await assert_refold_identical(log, state)
        except AssertionError as exc:
            counts.refold += 1
            counts.problems.append(f"{run_id}: {exc}"[:500])
    await _count_duplicate_keys(log, ids, counts)
    await _count_unrecorded(log, read_side_effects(side_effects), counts)
    return counts


async def _count_duplicate_keys(log: JetStreamEventLog, ids: Sequence[str], counts: FaultCounts) -> None:
    """One run per idempotency key among every run of the namespace (each extra run of an acked key: lost)."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for run_id in await log.list_runs():
        state = await _state(log, run_id)
        state = state.state if isinstance(state, RunCorrupt) else state
        if state is not None and state.idempotency_key is not None:
            by_key[state.idempotency_key].append(run_id)
    acked = set(ids)
    for key, runs in by_key.items():
        if len(runs) > 1 and acked.intersection(runs):
            counts.lost += len(runs) - 1
            counts.problems.append(f"idempotency key {key!r}: {len(runs)} runs {sorted(runs)}")


async def _count_unrecorded(log: JetStreamEventLog, lines: Sequence[str], counts: FaultCounts) -> None:
    """Each side-effect line must name an attempt dispatched in its run's log (any branch)."""
    counts.side_effects = len(lines)
    states: dict[str, RunState | None] = {}
    for line in lines:
        run_id, _, rest = line.partition(":")
        step_id, _, attempt = rest.rpartition(":")
        if run_id not in states:
            state = await _state(log, run_id)
            states[run_id] = state.state if isinstance(state, RunCorrupt) else state
        state = states[run_id]
        found = state is not None and attempt.isdigit() and any(
            a.attempt == int(attempt) for b in state.branches.values() for a in b.attempts.get(step_id, ()))
        if not found:
            counts.unrecorded += 1
            counts.problems.append(f"side effect {line!r}: no such attempt in the log")
