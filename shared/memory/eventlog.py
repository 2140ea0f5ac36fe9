"""An in-memory :class:`~reel.shared.core.ports.EventLog`: the JetStream log's twin for fast tests of decisions.

:class:`MemoryStore` is the store (one process, no I/O): one LSN sequence over all runs (as a
stream's sequence is), each run's commits **encoded** as the JetStream log stores them, commit
ids for dedup, and the runs' latest snapshots. :class:`MemoryEventLog` is one client of it —
several on one store are several writers/readers of one log, each with its own :attr:`fetched`
meter. Every read decodes and checks what it returns (:mod:`reel.shared.core.run.integrity`), so a bad
commit raises ``RunCorrupt`` as on the real log.

It passes the same contract suite as :class:`~reel.shared.nats.eventlog.JetStreamEventLog`
(tests/integration/test_eventlog_contract.py): the fence (expected LSN = the run's head, 0 for a
new run), dedup by commit id (a retry whose commit is the head gets its LSN back), reads at an LSN,
refresh, snapshots. Every call is one suspension point (``await asyncio.sleep(0)``), so writers
and readers interleave as they do against a server. What it cannot stand in for: a server's
failures, replication lag, redelivery, or timing between processes — concurrency tests stay on
a real nats-server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reel.shared.core.errors import ConcurrencyConflict, RunNotFound
from reel.shared.core.ports import EventLog
from reel.shared.core.run import integrity
from reel.shared.core.run.events import AnyEvent, Commit, encode_commit
from reel.shared.core.run.ids import CommitId, RunId, new_commit_id
from reel.shared.core.run.state import RunState
from reel.shared.core.run.statecodec import decode_state, encode_state
from reel.shared.core.wire.subjects import is_token


@dataclass
class MemoryStore:
    """The shared store: ``runs[run_id]`` is that run's ``(lsn, encoded commit)`` pairs, ascending.

    Attributes:
        last_lsn: the last LSN handed out (over all runs).
        snapshots: run id → ``(lsn, commit id, encoded state)`` of its latest snapshot.
    """

    runs: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    commit_ids: dict[str, dict[str, int]] = field(default_factory=dict)
    snapshots: dict[str, tuple[int, str, bytes]] = field(default_factory=dict)
    last_lsn: int = 0

    @property
    def stored(self) -> int:
        """How many commits the store holds (all runs)."""
        return sum(len(c) for c in self.runs.values())

    def append(self, run_id: str, body: bytes, *, expected_lsn: int, commit_id: str) -> int:
        """Append ``body`` to ``run_id`` fenced on ``expected_lsn``; the LSN (the original one for a retry).

        Raises:
            ConcurrencyConflict: the run's head is not ``expected_lsn`` and is not this very commit.
        """
        commits, ids = self.runs.get(run_id, []), self.commit_ids.setdefault(run_id, {})
        head = commits[-1][0] if commits else 0
        if commit_id in ids and (head == ids[commit_id] or head == expected_lsn):
            return ids[commit_id]  # a retry of a commit that landed: deduplicated
        if head != expected_lsn:
            raise ConcurrencyConflict(f"run {run_id}: expected head lsn {expected_lsn}, it is {head}",
                                      run_id=run_id, expected_lsn=expected_lsn)
        self.last_lsn += 1
        self.runs.setdefault(run_id, []).append((self.last_lsn, body))
        ids[commit_id] = self.last_lsn
        return self.last_lsn


class MemorySnapshots:
    """The :class:`~reel.shared.core.ports.SnapshotStore` of a :class:`MemoryStore` (states kept encoded)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def save(self, state: RunState, commit_id: str) -> object:
        """Keep ``state`` as its run's latest snapshot (``commit_id``: the commit at ``state.head_lsn``)."""
        self.store.snapshots[state.run_id] = (state.head_lsn, commit_id, encode_state(state))
        return state.head_lsn


class MemoryEventLog:
    """One client of a :class:`MemoryStore` (a new store if none is given).

    Attributes:
        fetched: commits this client has read so far (a snapshot read counts one): the read cost the
            contract suite meters.
    """

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store if store is not None else MemoryStore()
        self.fetched = 0

    async def commit(self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
                     commit_id: str | None = None) -> int:
        """See :meth:`reel.shared.core.ports.EventLog.commit`."""
        return await (await self.commit_async(run_id, events, expected_lsn=expected_lsn, writer=writer,
                                              commit_id=commit_id))

    async def commit_async(self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
                           commit_id: str | None = None) -> asyncio.Future[int]:
        """The commit is appended now (or refused); the future holds its LSN or the ConcurrencyConflict."""
        await asyncio.sleep(0)
        cid = commit_id or new_commit_id()
        body = encode_commit(Commit(commit_id=CommitId(cid), run_id=RunId(run_id), writer=writer, events=tuple(events)))
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(self.store.append(run_id, body, expected_lsn=expected_lsn, commit_id=cid))
        except ConcurrencyConflict as exc:
            fut.set_exception(exc)
        return fut

    async def _raw(self, run_id: str, upto_lsn: int | None = None, from_lsn: int = 0) -> list[tuple[int, bytes]]:
        await asyncio.sleep(0)
        if not is_token(run_id):
            return []
        out = [(lsn, body) for lsn, body in self.store.runs.get(run_id, ())
               if lsn >= from_lsn and (upto_lsn is None or lsn <= upto_lsn)]
        self.fetched += len(out)
        return out

    async def head(self, run_id: str) -> tuple[int, Commit] | None:
        """See :meth:`reel.shared.core.ports.EventLog.head`."""
        await asyncio.sleep(0)
        commits = self.store.runs.get(run_id) if is_token(run_id) else None
        if not commits:
            return None
        self.fetched += 1
        lsn, body = commits[-1]
        commit = integrity.check_commit(run_id, lsn, body)
        if isinstance(commit, integrity.Corruption):
            raise await self._corrupt(run_id, commit)
        return lsn, commit

    async def heads(self, run_ids: Sequence[str]) -> dict[str, int]:
        """See :meth:`reel.shared.core.ports.EventLog.heads`."""
        await asyncio.sleep(0)
        return {r: commits[-1][0] for r in run_ids if is_token(r) and (commits := self.store.runs.get(r))}

    async def first_lsn(self, run_id: str) -> int | None:
        """See :meth:`reel.shared.core.ports.EventLog.first_lsn`."""
        await asyncio.sleep(0)
        commits = self.store.runs.get(run_id) if is_token(run_id) else None
        if not commits:
            return None
        self.fetched += 1
        return commits[0][0]

    async def read(self, run_id: str, *, upto_lsn: int | None = None, from_lsn: int = 0) -> list[tuple[int, Commit]]:
        """See :meth:`reel.shared.core.ports.EventLog.read`."""
        commits, bad = integrity.decode_log(run_id, await self._raw(run_id, upto_lsn, from_lsn))
        if bad is not None:
            raise await self._corrupt(run_id, bad)
        return commits

    async def _corrupt(self, run_id: str, bad: integrity.Corruption) -> integrity.RunCorrupt:
        commits, _ = integrity.decode_log(run_id, await self._raw(run_id, bad.lsn - 1))
        state, earlier = integrity.fold_checked(commits)
        return integrity.RunCorrupt(earlier or bad, state)

    async def load(self, run_id: str, *, upto_lsn: int | None = None, cold: bool = False) -> RunState:
        """See :meth:`reel.shared.core.ports.EventLog.load` (from the run's snapshot unless ``cold``)."""
        state = None if cold else await self._from_snapshot(run_id, upto_lsn)
        if state is None:
            state, _ = _fold(run_id, await self._raw(run_id, upto_lsn), upto_lsn)
        if state is None:
            raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
        return state

    async def _from_snapshot(self, run_id: str, upto_lsn: int | None) -> RunState | None:
        snap = self.store.snapshots.get(run_id)
        if snap is None or (upto_lsn is not None and snap[0] > upto_lsn):
            return None
        lsn, commit_id, body = snap
        tail, bad = integrity.decode_log(run_id, await self._raw(run_id, upto_lsn, lsn))
        self.fetched += 1
        if bad is not None or not tail or tail[0][0] != lsn or tail[0][1].commit_id != commit_id:
            return None  # a mismatched snapshot or a bad commit above it: the cold fold decides
        after, illegal = integrity.fold_checked(tail[1:], start=decode_state(body))
        return None if illegal is not None else after

    async def refresh(self, state: RunState) -> tuple[RunState, list[tuple[int, Commit]]]:
        """See :meth:`reel.shared.core.ports.EventLog.refresh` (``state`` is never changed)."""
        after, commits = _fold(state.run_id, await self._raw(state.run_id, from_lsn=state.head_lsn + 1), start=state)
        return (state if after is None else after), commits

    async def list_runs(self) -> list[str]:
        """See :meth:`reel.shared.core.ports.EventLog.list_runs`."""
        await asyncio.sleep(0)
        return sorted(r for r, commits in self.store.runs.items() if commits)

    async def snapshots(self) -> MemorySnapshots:
        """The store's snapshots."""
        return MemorySnapshots(self.store)


def _fold(run_id: str, raw: list[tuple[int, bytes]], upto_lsn: int | None = None, *, start: RunState | None = None
          ) -> tuple[RunState | None, list[tuple[int, Commit]]]:
    """Decode and fold ``raw`` onto ``start``: (the state, the commits).

    Raises:
        RunCorrupt: a commit does not decode, names another run or is an illegal transition (the first
            bad one; the error carries the state as of the last good commit).
    """
    commits, undecodable = integrity.decode_log(run_id, raw)
    state, illegal = integrity.fold_checked(commits, upto_lsn, start=start)
    bad = illegal or undecodable
    if bad is not None:
        raise integrity.RunCorrupt(bad, state)
    return state, commits


if TYPE_CHECKING:
    _port: type[EventLog] = MemoryEventLog  # the twin satisfies the port (mypy checks it)
