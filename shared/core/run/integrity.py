"""Poison isolation in a run's log: a bad commit marks *that run* corrupt at its LSN.

A commit is bad when its body does not decode (:attr:`CorruptionKind.UNDECODABLE`), when it
names another run than the one whose subject holds it (:attr:`CorruptionKind.FOREIGN_RUN`:
``Commit.run_id``, a ``run_created``'s or a verdict's run id), or when the fold refuses it
(:attr:`CorruptionKind.INVALID_TRANSITION`: an outcome for an attempt never dispatched, a
``run_completed`` of a run not verifying…). The run is then corrupt at the first such LSN:
what it folds to is the state as of the last good commit, and nothing above the bad commit
counts. A read of a corrupt run raises :class:`RunCorrupt` carrying both, so every reader
handles it as one more refusal (:class:`~reel.shared.core.errors.ReelError`): ``reel ls`` lists it
as corrupt, the services refuse or skip it with one log line, writers never commit on top
of it (their fence forces a re-read above the bad commit, which raises) — and every other run
goes on. A read *at* an LSN below the bad commit (a view pinned before it) is unaffected.

Pure: bodies in, commits or a :class:`Corruption` out; no I/O, clock or logging. Good logs
fold exactly as :func:`reel.shared.core.run.fold.fold` folds them (the golden logs are unchanged).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum

import msgspec

from reel.shared.core.errors import InvalidTransition, ReelError, UnknownEventType
from reel.shared.core.run.events import Commit, RunCreated, VerdictRecorded, decode_commit
from reel.shared.core.run.fold import apply_commit, fold
from reel.shared.core.run.ids import LSN, RunId
from reel.shared.core.run.state import RunState

MAX_REASON_CHARS = 300
"""A reason longer than this is cut (a decode error can quote a large body)."""


class CorruptionKind(StrEnum):
    """Why a commit cannot be part of its run's history."""

    UNDECODABLE = "undecodable"
    FOREIGN_RUN = "foreign_run"
    INVALID_TRANSITION = "invalid_transition"


class Corruption(msgspec.Struct, frozen=True, kw_only=True):
    """Run ``run_id`` is corrupt from ``lsn`` on: the commit there is bad, for ``reason``."""

    run_id: RunId
    lsn: LSN
    kind: CorruptionKind
    reason: str

    def describe(self) -> str:
        """One line: ``run <id> is corrupt at LSN <n>: <reason>``."""
        return f"run {self.run_id} is corrupt at LSN {self.lsn}: {self.reason}"


class RunCorrupt(ReelError):
    """A read found the run corrupt (see module doc); never retryable.

    Attributes:
        corruption: where and why.
        state: the run folded as of its last good commit, or ``None`` if its first commit is bad.
    """

    code = "run_corrupt"

    def __init__(self, corruption: Corruption, state: RunState | None) -> None:
        super().__init__(corruption.describe(), run_id=corruption.run_id)
        self.corruption = corruption
        self.state = state


def _corruption(run_id: str, lsn: int, kind: CorruptionKind, reason: str) -> Corruption:
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS - 1] + "…"
    return Corruption(run_id=RunId(run_id), lsn=LSN(lsn), kind=kind, reason=reason)


def _named_run(commit: Commit, run_id: str) -> str | None:
    """The other run a commit names, if it names one."""
    if commit.run_id != run_id:
        return commit.run_id
    for e in commit.events:
        if isinstance(e, RunCreated) and e.run_id != run_id:
            return e.run_id
        if isinstance(e, VerdictRecorded) and e.verdict.run_id != run_id:
            return e.verdict.run_id
    return None


def check_commit(run_id: str, lsn: int, body: bytes) -> Commit | Corruption:
    """The commit stored at ``lsn`` on ``run_id``'s subject, or why it cannot be one of its commits."""
    try:
        commit = decode_commit(body)
    except (UnknownEventType, msgspec.MsgspecError) as exc:
        return _corruption(run_id, lsn, CorruptionKind.UNDECODABLE, f"the commit does not decode ({exc})")
    other = _named_run(commit, run_id)
    if other is not None:
        return _corruption(run_id, lsn, CorruptionKind.FOREIGN_RUN, f"the commit names another run ({other[:80]!r})")
    return commit


def decode_log(run_id: str, raw: Iterable[tuple[int, bytes]]) -> tuple[list[tuple[int, Commit]], Corruption | None]:
    """Decode ``(lsn, body)`` pairs in order up to the first bad one: ``(good commits, that corruption or None)``."""
    out: list[tuple[int, Commit]] = []
    for lsn, body in raw:
        commit = check_commit(run_id, lsn, body)
        if isinstance(commit, Corruption):
            return out, commit
        out.append((lsn, commit))
    return out, None


def apply_checked(state: RunState | None, lsn: int, commit: Commit) -> RunState | Corruption:
    """:func:`~reel.shared.core.run.fold.apply_commit`, an illegal transition returned as the run's corruption
    (``state``, never changed by the fold, is then the state as of the last good commit)."""
    try:
        return apply_commit(state, lsn, commit)
    except InvalidTransition as exc:
        return _corruption(commit.run_id, lsn, CorruptionKind.INVALID_TRANSITION, f"illegal transition: {exc.message}")


def fold_checked(commits: Sequence[tuple[int, Commit]], upto_lsn: int | None = None, *,
                 start: RunState | None = None) -> tuple[RunState | None, Corruption | None]:
    """:func:`~reel.shared.core.run.fold.fold` (onto ``start``) that stops at the first illegal transition.

    Good commits are folded in one go, exactly as :func:`~reel.shared.core.run.fold.fold` does; only a
    refused fold is walked again commit by commit to find the bad one.

    Returns:
        The state as of the last good commit (``start`` / ``None`` when there is none) and the
        corruption, if any.
    """
    try:
        return fold(commits, upto_lsn, start=start), None
    except InvalidTransition:
        pass
    state = start
    for lsn, commit in commits:
        if upto_lsn is not None and lsn > upto_lsn:
            break
        applied = apply_checked(state, lsn, commit)
        if isinstance(applied, Corruption):
            return state, applied
        state = applied
    raise AssertionError("unreachable: the fold refused a commit that applies on its own")  # pragma: no cover


def fold_or_raise(commits: Sequence[tuple[int, Commit]], upto_lsn: int | None = None, *,
                  start: RunState | None = None) -> RunState | None:
    """:func:`fold_checked`, a corruption raised.

    Raises:
        RunCorrupt: a commit is an illegal transition.
    """
    state, bad = fold_checked(commits, upto_lsn, start=start)
    if bad is not None:
        raise RunCorrupt(bad, state)
    return state
