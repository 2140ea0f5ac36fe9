"""Poison isolation in a session log (mirrors :mod:`reel.shared.core.run.integrity` for runs).

A commit on a session's subject is bad when its body does not decode, when it names
another session (``SessionCommit.session_id`` or a ``session_started``'s id), or when
the fold refuses it (an illegal transition: a second ``session_started``, an event
after the session's final end, an event before the first baseline…). The session is
then corrupt at the first such LSN: :func:`fold_checked` raises :class:`SessionCorrupt`
carrying the LSN, the reason and the state as of the last good commit, so ``resume``
refuses with one line, ``show`` prints what is known and says where it breaks, and
``ls`` lists it as corrupt — never a traceback. A writer never commits above it (its
fence names the last good LSN, which the bad commit moved past).

Pure: bodies in, a state or the error out.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from reel.shared.core.errors import InvalidTransition, UnknownEventType
from reel.shared.crucible.errors import CrucibleError
from reel.shared.crucible.events import SessionStarted, decode_session_commit
from reel.shared.crucible.fold import SessionState, apply_commit

MAX_REASON_CHARS = 300
"""A reason longer than this is cut (a decode error can quote a large body)."""


class SessionCorrupt(CrucibleError):
    """A read found the session corrupt at ``lsn`` (see module doc); never retryable.

    Attributes:
        session_id: the session.
        lsn: the LSN of the first bad commit.
        reason: why it cannot be one of the session's commits (one line).
        state: the session folded as of its last good commit (``None`` if the first commit is bad).
    """

    code = "crucible_session_corrupt"

    def __init__(self, session_id: str, lsn: int, reason: str, state: SessionState | None) -> None:
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS - 1] + "…"
        super().__init__(f"session {session_id} is corrupt at LSN {lsn}: {reason}")
        self.session_id, self.lsn, self.reason, self.state = session_id, lsn, reason, state


def fold_checked(session_id: str, raw: Iterable[tuple[int, bytes]]) -> SessionState | None:
    """Fold a session's ``(lsn, body)`` pairs in order (``None`` for an empty log).

    Raises:
        SessionCorrupt: at the first commit that does not decode, names another session or
            is an illegal transition.
    """
    state: SessionState | None = None
    for lsn, body in raw:
        try:
            commit = decode_session_commit(body)
        except (UnknownEventType, msgspec.MsgspecError) as exc:
            raise SessionCorrupt(session_id, lsn, f"the commit does not decode ({exc})", state) from exc
        named = {commit.session_id, *(e.session_id for e in commit.events if isinstance(e, SessionStarted))}
        other = sorted(named - {session_id})
        if other:
            raise SessionCorrupt(session_id, lsn, f"the commit names another session ({other[0][:80]!r})", state)
        try:
            state = apply_commit(state, lsn, commit)
        except InvalidTransition as exc:
            raise SessionCorrupt(session_id, lsn, f"illegal transition: {exc.message}", state) from exc
    return state
