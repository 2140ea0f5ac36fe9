"""The ports: what services and the application layer need from storage, as Protocols (no I/O here).

Pure declarations, satisfied structurally by the adapters in ``shared/nats/``:

* :class:`EventLog` — :class:`reel.shared.nats.eventlog.JetStreamEventLog` (one JetStream stream,
  one subject per run, LSN = stream sequence);
* :class:`BlobStore` — :class:`reel.shared.nats.blobstore.JetStreamBlobStore` (content-addressed
  bodies on the object store);
* :class:`SnapshotStore` — :class:`reel.shared.nats.snapshots.SnapshotStore` (run-state snapshots
  in KV, a read shortcut only);
* :class:`Liveness` — :class:`reel.shared.nats.leases.KvLiveness` (which executors hold a lease);
* :class:`OutcomeMarkers` — :class:`reel.shared.nats.markers.KvOutcomeMarkers` (the create-only outcome
  markers of attempts, and recovery's claim of a lost one);
* :class:`CommandBus` — :class:`reel.shared.nats.publish.JetStreamCommandBus` (the commands services send
  each other: resume a run, verify a run, the control signal of a committed cancel).

Services get them constructed once in ``serve()`` and type their handlers against these
Protocols, so another implementation plugs in without touching a handler: the in-memory
twin :class:`reel.shared.memory.eventlog.MemoryEventLog` runs the unit tests of decisions. The
behaviour every :class:`EventLog` must have is pinned by one contract suite, run against both:
tests/integration/test_eventlog_contract.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import IO, Protocol

from reel.shared.core.run.events import AnyEvent, BlobRef, Commit
from reel.shared.core.run.state import RunState


class SnapshotStore(Protocol):
    """Port: run-state snapshots (a shortcut for reads, never a source of truth)."""

    async def save(self, state: RunState, commit_id: str) -> object:
        """Store ``state`` as the run's latest snapshot; ``commit_id`` is the id of the commit at
        ``state.head_lsn`` (readers check it against the log). Returns the store's pointer."""
        ...


class EventLog(Protocol):
    """Port: the run event log. One append-only log per run; LSN = the log's sequence number.

    Every write is *fenced*: it names the head LSN the writer last saw (0 for a run
    that does not exist yet) and is refused with ``ConcurrencyConflict`` if anyone
    else committed since. A commit id makes a retried write idempotent.
    """

    async def commit(
        self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
        commit_id: str | None = None,
    ) -> int:
        """Append ``events`` as one commit of ``run_id``; returns its LSN.

        Args:
            expected_lsn: the run's head LSN as the writer last saw it (0: a new run).
            writer: who commits (recorded in the commit).
            commit_id: reuse to retry a write whose acknowledgement was lost (deduplicated).

        Raises:
            ConcurrencyConflict: the run's head is not ``expected_lsn`` (and is not this very commit).
        """
        ...

    async def commit_async(
        self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
        commit_id: str | None = None,
    ) -> asyncio.Future[int]:
        """Send the commit now; the future resolves to its LSN or raises as :meth:`commit` would."""
        ...

    async def head(self, run_id: str) -> tuple[int, Commit] | None:
        """The run's last commit and its LSN, or ``None`` (also for an id that is not one token).

        Raises RunCorrupt (:mod:`reel.shared.core.run.integrity`): the last commit does not decode or names another run.
        """
        ...

    async def first_lsn(self, run_id: str) -> int | None:
        """The LSN of the run's first commit (its ``run_created``), or ``None``."""
        ...

    async def heads(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The LSN of each run's last commit, for many runs in one look (runs without a commit left out); it may
        lag behind the runs' real heads (a replica that is behind), never lead them."""
        ...

    async def read(self, run_id: str, *, upto_lsn: int | None = None, from_lsn: int = 0) -> list[tuple[int, Commit]]:
        """The run's ``(lsn, commit)`` pairs with LSN in ``[from_lsn, upto_lsn]``, ascending.

        Costs O(the run's commits), never O(the log). Raises RunCorrupt: a commit does not decode
        (an event type this version does not know included) or names another run.
        """
        ...

    async def load(self, run_id: str, *, upto_lsn: int | None = None, cold: bool = False) -> RunState:
        """The run folded up to ``upto_lsn`` (default: its head); from a snapshot unless ``cold``.

        Raises:
            RunNotFound: the run has no commit at or below ``upto_lsn``.
            RunCorrupt: a commit at or below ``upto_lsn`` does not decode, names another run or is an
                illegal transition; it carries the run as of its last good commit.
        """
        ...

    async def refresh(self, state: RunState) -> tuple[RunState, list[tuple[int, Commit]]]:
        """``state`` brought up to the run's head by applying only the commits above
        ``state.head_lsn``; returns the new state and those commits, ascending. Raises RunCorrupt
        (see :meth:`load`) when one of them is bad."""
        ...

    async def list_runs(self) -> list[str]:
        """Ids of the runs that have at least one commit, sorted."""
        ...

    async def snapshots(self) -> SnapshotStore | None:
        """The snapshot store beside the log, or ``None`` if there is none."""
        ...


class Liveness(Protocol):
    """Port: whether an executor is alive — it holds a lease now (the read side of the leases)."""

    async def alive(self, executor_id: str | None) -> bool:
        """True while ``executor_id`` holds a lease. ``None`` or an id that cannot be a key: False. A lease
        that cannot be read: True (a caller never takes over a run on a guess)."""
        ...


class OutcomeMarkers(Protocol):
    """Port: outcome markers — attempt key (``<run>.<branch>.<step>.<attempt>``) → the output ref an executor
    stored before its outcome commit. Markers are only ever created, never overwritten."""

    async def read(self, key: str) -> BlobRef | None:
        """The marker's output ref; ``None``: no marker, recovery's lost claim, or an unreadable body."""
        ...

    async def claim_lost(self, key: str) -> BlobRef | None:
        """:meth:`read`; when there is no marker, create recovery's lost claim under ``key`` first (so a late
        marker of that attempt is refused) — a marker that lands meanwhile wins and is returned."""
        ...


class CommandBus(Protocol):
    """Port: the commands services send each other (deduplicated per run and LSN) and the cancel signal."""

    async def resume(self, run_id: str, at_lsn: int) -> None:
        """Queue ``ResumeRun`` for an executor (deduplicated per (run, the LSN that made it needed))."""
        ...

    async def verify(self, run_id: str, branch_id: str, snapshot_lsn: int) -> None:
        """Queue the verification trigger of the run's ``run_verifying`` at ``snapshot_lsn`` (deduplicated)."""
        ...

    async def control(self, run_id: str, lsn: int) -> None:
        """Tell the executor driving ``run_id`` that its cancel is committed at ``lsn`` (best effort)."""
        ...


class BlobStore(Protocol):
    """Port: bodies stored by content (sha256), fetched lazily by :class:`BlobRef`."""

    async def put(self, data: bytes, media_type: str = "text/plain") -> BlobRef:
        """Store ``data`` (idempotent: content-addressed, never overwritten); returns its ref."""
        ...

    async def put_async(self, data: bytes, media_type: str = "text/plain") -> asyncio.Future[BlobRef]:
        """Start storing ``data`` now; the future resolves to its ref once stored."""
        ...

    async def put_file(self, source: IO[bytes], ref: BlobRef) -> BlobRef:
        """Store the body read from ``source`` to EOF as ``ref`` (its sha256 and size known), streamed.

        Raises:
            BlobCorrupt: what was read is not ``ref``'s body (nothing stored).
        """
        ...

    async def get_file(self, ref: BlobRef, into: IO[bytes] | None) -> int:
        """Stream the body of ``ref`` into ``into`` (``None``: only check it), checked; its size (bytes)."""
        ...

    def chunks(self, ref: BlobRef) -> AsyncIterator[bytes]:
        """The body of ``ref`` chunk by chunk, each fetched when asked for, never held whole; checked as it
        goes (a mismatch raises BlobCorrupt after the last chunk: the body is unchecked until the end)."""
        ...

    async def head_tail(self, ref: BlobRef, head_bytes: int, tail_bytes: int) -> tuple[bytes, bytes, int]:
        """The first ``head_bytes`` and last ``tail_bytes`` of the body (never overlapping) and its size (bytes),
        streamed and checked whole."""
        ...

    async def get(self, ref: BlobRef) -> bytes:
        """The body of ``ref``.

        Raises:
            BlobMissing: no such body, or it does not hash to ``ref.sha256``.
            BlobTimeout: the read took longer than the store's timeout.
        """
        ...

    async def get_text(self, ref: BlobRef) -> str:
        """:meth:`get`, decoded as UTF-8 (invalid bytes replaced)."""
        ...

    async def exists(self, ref: BlobRef) -> bool:
        """True if the store holds the body of ``ref``."""
        ...
