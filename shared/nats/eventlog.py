"""The event log: one JetStream stream, one subject per run, LSN = stream sequence.

:class:`JetStreamEventLog` keeps run commits (:class:`~reel.shared.core.run.events.Commit`) on a
:class:`~reel.shared.nats.subjectlog.SubjectLog` (fenced appends, batched Direct Get reads of one
run's subject). Every read is checked (:mod:`reel.shared.core.run.integrity`): a commit that does not
decode, names another run or is an illegal transition makes the read raise ``RunCorrupt``
for that run, with its state as of the last good commit.

Reads see what must be seen on a replicated stream (R3): this log's own commits, the commits it
read before, the LSN a snapshot was taken at and a pinned ``upto_lsn`` — a lagging follower's
answer is completed from the stream leader (:class:`~reel.shared.nats.subjectlog.SubjectLog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import structlog
from nats.aio.client import Client

from reel.shared.core.errors import RunNotFound
from reel.shared.core.ports import EventLog
from reel.shared.core.run import integrity
from reel.shared.core.run.events import AnyEvent, Commit, encode_commit
from reel.shared.core.run.ids import CommitId, RunId, new_commit_id
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.subjects import Names, is_token
from reel.shared.nats.publish import is_transient
from reel.shared.nats.snapshots import SnapshotStore
from reel.shared.nats.subjectlog import READ_TIMEOUT_S, SubjectLog, msg_seq
from reel.shared.runtime import metrics

log = structlog.get_logger(__name__)


class JetStreamEventLog:
    """The :class:`~reel.shared.core.ports.EventLog` port: run commits on ``Names.events_stream``."""

    def __init__(self, nc: Client, names: Names, *, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.names = names
        self.subjects = SubjectLog(nc, names.events_stream, names.events, timeout_s=timeout_s)
        self._nc = nc
        self._snapshots: SnapshotStore | None = None
        self._snapshots_opened = False

    async def snapshots(self) -> SnapshotStore | None:
        """The namespace's snapshot store (opened once), or ``None`` if it has none.

        Raises:
            nats.errors.Error: JetStream did not answer (an election, a failover): the next call tries again.
        """
        if not self._snapshots_opened:
            self._snapshots = await SnapshotStore.open(self._nc, self.names)
            self._snapshots_opened = True
        return self._snapshots

    async def commit(
        self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
        commit_id: str | None = None,
    ) -> int:
        """Append one commit to ``run_id``'s subject; returns its LSN.

        Args:
            expected_lsn: the run's head LSN as the writer last saw it (0: new run).
            commit_id: reuse to retry a publish whose ack was lost (deduplicated).

        Raises:
            ConcurrencyConflict: someone else committed since ``expected_lsn``.
        """
        return await (await self.commit_async(run_id, events, expected_lsn=expected_lsn, writer=writer,
                                              commit_id=commit_id))

    async def commit_async(
        self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
        commit_id: str | None = None,
    ) -> asyncio.Future[int]:
        """Send the commit now; the returned future resolves to its LSN (see :meth:`commit`).

        Lets a caller pipeline the commit with other publishes (e.g. a blob) and
        await all acks together.
        """
        cid = commit_id or new_commit_id()
        body = encode_commit(Commit(commit_id=CommitId(cid), run_id=RunId(run_id), writer=writer, events=tuple(events)))
        fut = await self.subjects.append_async(run_id, body, expected_seq=expected_lsn, commit_id=cid)
        if metrics.enabled():  # the one place commits are counted (nothing to count without /metrics)
            fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() is not None
                                  else metrics.observe_commit(run_id, events))
        return fut

    def note(self, run_id: str, lsn: int) -> None:
        """Remember that ``run_id`` has a commit at ``lsn`` (e.g. a reply's LSN): later reads include it."""
        self.subjects.note(run_id, lsn)

    async def head(self, run_id: str) -> tuple[int, Commit] | None:
        """The run's last commit and its LSN, or ``None`` if the run has none.

        Reads take ``run_id`` from commands, so an id that is not one subject token
        (``*``, ``>``, ``a.b``) names no run: it must never be read as a subject
        pattern matching other runs.

        Raises:
            RunCorrupt: the last commit does not decode or names another run.
        """
        if not is_token(run_id):
            return None
        msg = await self.subjects.head_msg(run_id)
        if msg is None:
            return None
        commit = integrity.check_commit(run_id, msg_seq(msg), msg.data)
        if isinstance(commit, integrity.Corruption):
            raise await self._corrupt(run_id, commit)
        return msg_seq(msg), commit

    async def heads(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The LSN of each run's last commit, in one request per 256 runs (runs with no commit, and ids that
        are not one subject token, are left out). From a replica that is behind, an LSN may be below the head."""
        return await self.subjects.last_seqs([r for r in run_ids if is_token(r)])

    async def first_lsn(self, run_id: str) -> int | None:
        """LSN of the run's first commit (its ``run_created``), or ``None`` (see :meth:`head`)."""
        return await self.subjects.first_seq(run_id) if is_token(run_id) else None

    async def read(self, run_id: str, *, upto_lsn: int | None = None, from_lsn: int = 0) -> list[tuple[int, Commit]]:
        """The run's commits with LSN in ``[from_lsn, upto_lsn]``, in order.

        An id that is not one subject token has no commits (see :meth:`head`).

        Raises:
            RunCorrupt: a commit does not decode (an event this version does not know included)
                or names another run (:mod:`reel.shared.core.run.integrity`).
        """
        if not is_token(run_id):
            return []
        raw = await self.subjects.read_raw(run_id, upto_seq=upto_lsn, from_seq=from_lsn, expect_seq=upto_lsn)
        with gc_paused():
            commits, bad = integrity.decode_log(run_id, raw)
        if bad is not None:
            raise await self._corrupt(run_id, bad)
        return commits

    async def _corrupt(self, run_id: str, bad: integrity.Corruption) -> integrity.RunCorrupt:
        """The error for ``run_id`` found corrupt at ``bad.lsn``: with the run folded as of its last good commit
        (a cold read below ``bad.lsn``; one more bad commit there is reported instead)."""
        raw = await self.subjects.read_raw(run_id, upto_seq=bad.lsn - 1) if bad.lsn > 1 else []
        state, _, earlier = _fold_raw(run_id, raw)
        return integrity.RunCorrupt(earlier or bad, state)

    async def load(self, run_id: str, *, upto_lsn: int | None = None, cold: bool = False) -> RunState:
        """The run's state folded up to ``upto_lsn`` (default: its head).

        Starts from the run's latest snapshot at or below ``upto_lsn`` when there is
        one (shared/nats/snapshots.py) and replays only the commits from the snapshot's
        LSN on — checking that the commit at that LSN is the one the snapshot was
        taken after; otherwise, or with ``cold``, it folds the whole run from its
        first commit. Both give the same state (tested byte for byte).

        Raises:
            RunNotFound: the run has no commit at or below ``upto_lsn``.
            RunCorrupt: a commit at or below ``upto_lsn`` does not decode, names another run or
                is an illegal transition (:mod:`reel.shared.core.run.integrity`); it carries the run as
                of its last good commit.
        """
        state = None
        if is_token(run_id):  # an id that is not one subject token names no run (see :meth:`head`)
            state = None if cold else await self._load_from_snapshot(run_id, upto_lsn)
            if state is None:
                raw = await self.subjects.read_raw(run_id, upto_seq=upto_lsn, expect_seq=upto_lsn)
                state, _, bad = _fold_raw(run_id, raw, upto_lsn)
                if bad is not None:
                    raise integrity.RunCorrupt(bad, state)
        if state is None:
            raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
        return state

    async def _load_from_snapshot(self, run_id: str, upto_lsn: int | None) -> RunState | None:
        try:
            store = await self.snapshots()
            ref = await store.latest(run_id) if store is not None else None
        except Exception as exc:  # a snapshot is only a shortcut: without an answer, fold from the log
            if not is_transient(exc):
                raise
            log.warning("snapshot.unavailable", run_id=run_id, error=repr(exc)[:200])
            return None
        if store is None or ref is None or (upto_lsn is not None and ref.lsn > upto_lsn):
            return None
        self.subjects.note(run_id, ref.lsn)  # the snapshot's commit exists: a lagging replica is not the truth
        with gc_paused():
            tail, bad = integrity.decode_log(run_id, await self.subjects.read_raw(
                run_id, upto_seq=upto_lsn, from_seq=ref.lsn, expect_seq=upto_lsn))
        if not tail or tail[0][0] != ref.lsn or tail[0][1].commit_id != ref.commit_id:
            log.warning("snapshot.mismatch", run_id=run_id, lsn=ref.lsn)
            return None
        state = await store.state(ref)
        if bad is not None or state is None or state.head_lsn != ref.lsn:
            return None  # a bad commit above the snapshot: the cold fold reports it
        with gc_paused():
            after, illegal = integrity.fold_checked(tail[1:], start=state)
        return None if illegal is not None else after

    async def refresh(self, state: RunState) -> tuple[RunState, list[tuple[int, Commit]]]:
        """Bring a folded ``state`` up to the run's head by applying only the commits above it.

        Returns the state at the new head (``state`` itself when nothing is new; ``state`` is
        never changed) and the commits applied, in order.

        Raises:
            RunCorrupt: a new commit is bad (see :meth:`load`); it carries the state as of the last good one.
        """
        raw = await self.subjects.read_raw(state.run_id, from_seq=state.head_lsn + 1)
        after, new, bad = _fold_raw(state.run_id, raw, start=state)
        if bad is not None:
            raise integrity.RunCorrupt(bad, after)
        return (state if after is None else after), new

    async def list_runs(self) -> list[str]:
        """Run ids that have at least one commit."""
        return await self.subjects.keys(self.names.events(""))


def _fold_raw(run_id: str, raw: list[tuple[int, bytes]], upto_lsn: int | None = None, *,
              start: RunState | None = None
              ) -> tuple[RunState | None, list[tuple[int, Commit]], integrity.Corruption | None]:
    """Decode and fold ``raw`` onto ``start``, checked: (the state as of the last good commit, the good
    commits decoded, the first bad commit's corruption or ``None``)."""
    with gc_paused():
        commits, undecodable = integrity.decode_log(run_id, raw)
        state, illegal = integrity.fold_checked(commits, upto_lsn, start=start)
    return state, commits, illegal or undecodable


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a read decodes or folds many long-lived objects.

    A load allocates thousands of objects that all survive; the collector would rescan
    them again and again (dozens of full passes for a 10,000-commit run) without ever
    freeing one. A performance choice of this adapter, not part of the fold's meaning
    (the core never touches the GC). Synchronous code only: nothing else runs meanwhile.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


if TYPE_CHECKING:
    _port: type[EventLog] = JetStreamEventLog  # the adapter satisfies its port (mypy checks it)
