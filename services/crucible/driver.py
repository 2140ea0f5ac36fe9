"""``Driver``: one session being driven — its folded state, its ports, and the one way it commits.

The loop never assigns to ``Run``: :meth:`Driver.commit` appends events to the
session log (one writer, guarded, LSN = stream sequence) and folds them with the
same pure :func:`reel.shared.crucible.fold.apply_commit` that ``resume`` uses, so the
live state *is* a re-fold of the log.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog

from reel.services.crucible.judge import Judge
from reel.services.crucible.lab import LabJudge
from reel.services.crucible.proposer import Proposer
from reel.services.crucible.sessionlog import SessionLog
from reel.services.crucible.world import GitWorld
from reel.shared.core.ports import BlobStore
from reel.shared.crucible.config import Regime, SessionConfig
from reel.shared.crucible.events import AnySessionEvent, SessionEnded
from reel.shared.crucible.fold import SessionState, apply_commit
from reel.shared.crucible.state import LoopExit, Run, WorldSha
from reel.shared.nats.client import ReelClient

log = structlog.get_logger("reel.crucible")


def now_ms() -> int:
    """Wall clock, epoch ms (the only clock read that reaches the log)."""
    return int(time.time() * 1000)


def ms_since(t0: float) -> int:
    """Milliseconds elapsed since ``t0`` (a ``time.perf_counter()`` reading)."""
    return int((time.perf_counter() - t0) * 1000)


@dataclass
class Driver:
    """One session being driven: its folded state and the ports the loop uses."""

    state: SessionState
    log: SessionLog
    world: GitWorld
    proposer: Proposer
    blobs: BlobStore
    stop: asyncio.Event
    fingerprint_parts: dict[str, str] = field(default_factory=dict)
    runs: ReelClient | None = None
    """Reel's client on the session's connection: a ``lab`` judge starts its runs with it."""
    _judges: dict[str, Judge] = field(default_factory=dict)

    @property
    def cfg(self) -> SessionConfig:
        return self.state.started.config

    @property
    def session_id(self) -> str:
        return self.state.session_id

    @property
    def run(self) -> Run:
        assert self.state.run is not None, "no baseline yet"
        return self.state.run

    def regime(self) -> Regime:
        return self.cfg.regime(self.run.segment.regime)

    def judge(self, regime: Regime) -> Judge:
        if regime.name not in self._judges:
            spec = regime.judge
            self._judges[regime.name] = LabJudge(spec, self.runs) if spec.lab is not None else Judge(spec)
        return self._judges[regime.name]

    def tag(self, regime: str, it: int, target: str, sha: str) -> dict[str, str]:
        """The labels of a measurement of ``sha`` (``target``: baseline, candidate or incumbent) in iteration
        ``it`` of ``regime`` (a ``lab`` judge's runs carry them)."""
        return {"crucible.session": self.session_id, "crucible.regime": regime, "crucible.iteration": str(it),
                "crucible.target": target, "crucible.sha": sha}

    async def commit(self, *events: AnySessionEvent) -> int:
        """Append ``events`` as one commit and fold them into the state; the commit's LSN.

        Raises:
            SessionBusy: another writer moved the session's log.
        """
        lsn, commit = await self.log.append(self.session_id, events, expected_lsn=self.state.lsn)
        self.state = apply_commit(self.state, lsn, commit)
        for e in events:
            log.debug("crucible.event", type=type(e).__name__, lsn=lsn)
        return lsn

    async def end(self, exit_: LoopExit, reason: str, *before: AnySessionEvent) -> LoopExit:
        """Commit ``before`` and the ``SessionEnded`` together (one atomic commit); return the exit."""
        await self.commit(*before, SessionEnded(exit=exit_, reason=reason, at_ms=now_ms()))
        log.info("crucible.ended", exit=exit_.value, exit_code=exit_.exit_code, reason=reason)
        return exit_

    async def best(self, *, reattach: bool = False) -> WorldSha:
        """Roll the world back to the best snapshot (or the base, before any baseline); that snapshot.

        ``reattach``: first put HEAD back on the session branch (on resume, see :meth:`GitWorld.rollback`).
        """
        snap = self.run.segment.best_snap if self.state.run is not None else WorldSha(self.state.started.base_sha)
        await self.world.rollback(snap, reattach=reattach)
        return snap
