"""The session log on JetStream: stream ``<NS>_CRUCIBLE``, subject ``<ns>.crucible.<session_id>``.

Same commit discipline as run events: one writer per session, every
commit one message fenced with ``Nats-Expected-Last-Subject-Sequence`` (the LSN
the writer last saw) and carrying its commit id as ``Nats-Msg-Id``; LSN = stream
sequence; reads are batched Direct Gets of the session's own subject
(:class:`reel.shared.nats.subjectlog.SubjectLog`). A lost fence is never retried: one process
drives a session (world lock), so it means another one does (:class:`SessionBusy`).
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js import api as jsapi

from reel.shared.core.run.ids import new_commit_id
from reel.shared.crucible.errors import SessionBusy, SessionNotFound
from reel.shared.crucible.events import AnySessionEvent, SessionCommit, decode_session_commit, encode_session_commit
from reel.shared.crucible.fold import SessionState
from reel.shared.crucible.integrity import fold_checked
from reel.shared.crucible.names import CrucibleNames
from reel.shared.nats.infra import DUPLICATE_WINDOW_S, ensure_stream, storage_type
from reel.shared.nats.subjectlog import SubjectLog
from reel.shared.runtime.config import Config


async def ensure_session_stream(js: JetStreamContext, cfg: Config) -> None:
    """Create (or update to) the session-log stream; idempotent."""
    names = CrucibleNames(cfg.names)
    await ensure_stream(js, jsapi.StreamConfig(
        name=names.stream, subjects=[names.all_sessions], num_replicas=cfg.replicas, storage=storage_type(cfg),
        retention=jsapi.RetentionPolicy.LIMITS, allow_direct=True, duplicate_window=DUPLICATE_WINDOW_S,
        description="Crucible session logs: one subject per session, one message per commit, LSN = stream sequence",
    ))


def _busy(session_id: str, message: str, _expected: int) -> SessionBusy:
    """A lost fence on a session: one process drives a session, so it is never retried."""
    return SessionBusy(f"session {session_id} was written by another process ({message})")


class SessionLog:
    """Guarded appends and cold reads of session logs."""

    def __init__(self, nc: Client, cfg: Config, *, writer: str = "crucible") -> None:
        self.names = CrucibleNames(cfg.names)
        self.subjects = SubjectLog(nc, self.names.stream, self.names.session, conflict=_busy)
        self.writer = writer

    async def append(self, session_id: str, events: Sequence[AnySessionEvent], *, expected_lsn: int,
                     commit_id: str | None = None) -> tuple[int, SessionCommit]:
        """Commit ``events`` atomically (one message); its LSN and the commit.

        Raises:
            SessionBusy: someone else wrote to the session since ``expected_lsn``.
        """
        commit = SessionCommit(commit_id=commit_id or new_commit_id(), session_id=session_id, writer=self.writer,
                               events=tuple(events))
        lsn = await self.subjects.append(session_id, encode_session_commit(commit), expected_seq=expected_lsn,
                                         commit_id=commit.commit_id)
        return lsn, commit

    async def read(self, session_id: str, *, upto_lsn: int | None = None) -> list[tuple[int, SessionCommit]]:
        """The session's commits in order (up to ``upto_lsn``)."""
        raw = await self.subjects.read_raw(session_id, upto_seq=upto_lsn)
        return [(lsn, decode_session_commit(body)) for lsn, body in raw]

    async def events(self, session_id: str) -> list[AnySessionEvent]:
        """Every event of the session, in order."""
        return [e for _, c in await self.read(session_id) for e in c.events]

    async def load(self, session_id: str) -> SessionState:
        """Cold re-fold of the session, every commit checked (:func:`reel.shared.crucible.integrity.fold_checked`).

        Raises:
            SessionNotFound: no log for ``session_id``.
            SessionCorrupt: a bad commit on its subject (the LSN, the reason, the state before it).
        """
        state = fold_checked(session_id, await self.subjects.read_raw(session_id))
        if state is None:
            raise SessionNotFound(f"no crucible session {session_id!r}")
        return state

    async def exists(self, session_id: str) -> bool:
        """True if the session has at least one commit."""
        return await self.subjects.head_msg(session_id) is not None

    async def sessions(self) -> list[str]:
        """Every session id with a log."""
        return await self.subjects.keys(self.names.sessions_prefix)
