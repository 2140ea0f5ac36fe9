"""Gates that run before an iteration enters ``Proposed``.

The loop (services/crucible/loop.py) runs them inline, in this order, before
every iteration (inline until they get unwieldy):

1. stop      — a stop was requested (signal): ``LoopExit.STOPPED``.
2. rescope   — the regime was solved and another follows, or the proposer asked:
               a new baseline, one ``Segment`` assignment.
3. budget    — :func:`reel.shared.crucible.budget.exhausted`.
4. park      — :func:`probe`: the configured probe says wait (exit 75); the loop
               re-probes every ``poll_s``; parked time is excluded from the time budget.
5. provisioning — while the proposer or judge reports a missing resource (exit 75)
               the iteration is blocked (``pending_block``): it waits ``retry_s`` and retries
               the same step, it does not discard; past ``max_block_s`` it escalates.
6. deny      — :func:`denied`: a candidate touching the judge's files, its data, the
               config (budget settings) or ``gates.protect`` is refused before it is applied.
7. escalation — the proposer asked for a human, a denied change (``on_deny: escalate``),
               a broken park probe, or an invalid baseline: roll back to the best
               snapshot, record the reason, ``LoopExit.ESCALATED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from reel.services.crucible import proc
from reel.shared.crucible.config import ParkSpec, SessionConfig


def _inside(path: Path, root: Path) -> str | None:
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return None
    return rel.as_posix()


def protected_paths(cfg: SessionConfig, source_repo: Path) -> tuple[str, ...]:
    """World-relative paths no candidate may touch (sorted; ``.`` would mean the whole world).

    The judges' world-relative ``reads`` (and a ``lab`` judge's workflow: it is the judge), ``gates.protect``, and
    the config file
    itself when it lives in the source repository (it holds the budget settings).
    Reads outside the world (e.g. a data directory) cannot be edited through a
    candidate; the fingerprint guards them.
    """
    out: set[str] = set(cfg.gates.protect)
    for regime in cfg.regimes:
        out.update(r for r in regime.judge.reads if not os.path.isabs(r))
        if regime.judge.lab is not None:
            out.add(regime.judge.lab.workflow)
    if cfg.config_path:
        rel = _inside(Path(cfg.config_path), source_repo)
        if rel is not None:
            out.add(rel)
    return tuple(sorted(os.path.normpath(p) for p in out))


def denied(paths: Iterable[str], protected: Iterable[str]) -> tuple[str, ...]:
    """The candidate's paths that are, or lie under, a protected path."""
    prot = tuple(protected)
    return tuple(p for p in paths if any(q == "." or p == q or p.startswith(q.rstrip("/") + "/") for q in prot))


@dataclass(frozen=True)
class Go:
    """The park probe lets the iteration run."""


@dataclass(frozen=True)
class Park:
    """The park probe says wait (its last stdout line is the reason)."""

    reason: str


@dataclass(frozen=True)
class Broken:
    """The park probe failed: escalate (a broken gate needs a human)."""

    reason: str


async def probe(spec: ParkSpec, world: Path) -> Go | Park | Broken:
    """Run the park probe once (exit 0 go, 75 park, anything else broken)."""
    try:
        done = await proc.run(spec.command, cwd=world, env=proc.base_env(spec.pass_env),
                              timeout_s=max(30.0, spec.poll_s))
    except OSError as exc:
        return Broken(f"park probe cannot start: {exc}")
    if done.returncode == 0 and not done.timed_out:
        return Go()
    if done.returncode == proc.EX_TEMPFAIL and not done.timed_out:
        return Park(done.last_line() or "parked")
    why = "timed out" if done.timed_out else f"exit {done.returncode}: {done.last_line('stderr') or done.last_line()}"
    return Broken(f"park probe failed: {why}")


async def wait(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` unless a stop arrives first; True if stopped."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):  # unlike 3.11's wait_for, never swallows a cancel
            await stop.wait()
    return stop.is_set()
