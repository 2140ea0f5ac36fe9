"""Fixtures of the Crucible suite: an in-process driver against the session's real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reel.services.crucible.session import backend, resume_session, start_session
from reel.shared.crucible.config import SessionConfig
from reel.shared.crucible.events import AnySessionEvent
from reel.shared.crucible.fold import SessionState
from reel.shared.crucible.state import LoopExit
from reel.shared.proc.subreaper import stop_being_subreaper
from reel.shared.runtime.config import Config


@dataclass
class SessionResult:
    """What a test inspects after a session: id, exit, folded state, every event."""

    session_id: str
    exit: LoopExit
    state: SessionState
    events: list[AnySessionEvent]
    live: SessionState | None = None

    def of(self, kind: type) -> list[AnySessionEvent]:
        return [e for e in self.events if isinstance(e, kind)]


class Crucible:
    """Runs and resumes sessions in-process (real git, real JetStream)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    async def run(self, config: SessionConfig, *, session_id: str | None = None,
                  stop: asyncio.Event | None = None) -> SessionResult:
        async with backend(self.cfg, writer="test") as b:
            res = await start_session(b, config, stop=stop or asyncio.Event(), session_id=session_id)
            sid = res.session_id
            return SessionResult(sid, res.exit, await b.log.load(sid), await b.log.events(sid), res.state)

    async def resume(self, session_id: str) -> SessionResult:
        async with backend(self.cfg, writer="test") as b:
            res = await resume_session(b, session_id, stop=asyncio.Event())
            return SessionResult(session_id, res.exit, await b.log.load(session_id), await b.log.events(session_id),
                           res.state)

    async def load(self, session_id: str) -> SessionResult:
        async with backend(self.cfg, writer="test") as b:
            state = await b.log.load(session_id)
            assert state.ended is not None
            return SessionResult(session_id, state.ended.exit, state, await b.log.events(session_id))


@pytest.fixture
def crucible(cfg: Config) -> Iterator[Crucible]:
    yield Crucible(cfg)
    stop_being_subreaper()  # a session made the test process a subreaper: other suites' orphans go to init


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path
