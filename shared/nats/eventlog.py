"""The event log: one JetStream stream, one subject per run, LSN = stream sequence (brief §4).

Two layers:

* :class:`SubjectLog` — a guarded, per-key append-only log of opaque bodies on a
  stream (``subject_of(key)`` is one subject per key). Writes are fenced with
  ``Nats-Expected-Last-Subject-Sequence`` (the sequence the writer last saw; ``0``
  for a new key) and carry a commit id as ``Nats-Msg-Id`` (a retried publish is
  deduplicated). Reads use batched Direct Get on the key's own subject, starting
  at its first sequence, so replaying one key costs O(its messages), not O(stream).
  Crucible's session log uses it too.
* :class:`JetStreamEventLog` — run commits (:class:`~shared.core.events.Commit`) on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

from shared.core import fold as folding
from shared.core.errors import ConcurrencyConflict, ReelError, RunNotFound
from shared.core.events import AnyEvent, Commit, decode_commit, encode_commit
from shared.core.ids import CommitId, RunId, is_token, new_commit_id
from shared.core.ports import EventLog
from shared.core.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER, MSG_ID_HEADER, Names
from shared.nats.access import fail_if_denied
from shared.nats.publish import request_ack
from shared.nats.snapshots import SnapshotStore

log = structlog.get_logger(__name__)

WRONG_LAST_SEQUENCE = 10071
RACING_WRITE = 10164  # clustered: a write racing an in-flight one on the same subject
DIRECT_GET_BATCH = 256
READ_TIMEOUT_S = 10.0
COMMIT_ID_HEADER = "Reel-Commit-Id"


def concurrency_conflict(key: str, message: str, expected_seq: int) -> ReelError:
    """The error a lost fence raises by default: :class:`ConcurrencyConflict` (``run_id`` = the key)."""
    return ConcurrencyConflict(message, run_id=key, expected_lsn=expected_seq)


class SubjectLog:
    """A guarded append-only log per key on one stream (see module doc).

    Args:
        stream: the stream name (must have ``allow_direct``).
        subject_of: key → its subject (one token per key).
        conflict: ``(key, message, expected_seq)`` → the error a lost fence raises
            (default :func:`concurrency_conflict`; crucible's session log: ``SessionBusy``).
    """

    def __init__(self, nc: Client, stream: str, subject_of: Callable[[str], str], *,
                 timeout_s: float = READ_TIMEOUT_S,
                 conflict: Callable[[str, str, int], ReelError] = concurrency_conflict) -> None:
        self._conflict = conflict
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self.stream = stream
        self.subject_of = subject_of
        self._timeout_s = timeout_s

    def _headers(self, cid: str, expected_seq: int) -> dict[str, str]:
        return {MSG_ID_HEADER: cid, EXPECTED_LAST_SUBJECT_SEQ_HEADER: str(expected_seq), COMMIT_ID_HEADER: cid}

    async def append_async(self, key: str, body: bytes, *, expected_seq: int,
                           commit_id: str | None = None) -> asyncio.Future[int]:
        """Send one message now; the future resolves to its sequence (see :meth:`append`)."""
        cid = commit_id or new_commit_id()
        ack = request_ack(self._nc, self.subject_of(key), body, self._headers(cid, expected_seq), self._timeout_s)
        return asyncio.ensure_future(self._settle(key, cid, expected_seq, ack))

    async def append(self, key: str, body: bytes, *, expected_seq: int, commit_id: str | None = None) -> int:
        """Append one message to the key's subject, fenced on ``expected_seq``; returns its sequence.

        Raises:
            ConcurrencyConflict: (or the ``conflict`` error) the key's last sequence is not
                ``expected_seq`` and the head is not this very commit (a retry that landed).
        """
        return await (await self.append_async(key, body, expected_seq=expected_seq, commit_id=commit_id))

    async def _settle(self, key: str, cid: str, expected_seq: int, ack_wait: Awaitable[PubAck]) -> int:
        try:
            ack = await ack_wait
        except APIError as exc:
            if exc.err_code not in (WRONG_LAST_SEQUENCE, RACING_WRITE):
                raise
            head = await self.head_msg(key)
            if head is not None and (head.headers or {}).get(COMMIT_ID_HEADER) == cid:
                return msg_seq(head)  # our earlier publish of this commit landed
            raise self._conflict(
                key, f"{key} moved past sequence {expected_seq} (now {msg_seq(head) if head else 0})", expected_seq,
            ) from exc
        return int(ack.seq)

    async def _direct_get(self, payload: dict[str, object], subject_suffix: str = "") -> list[Msg]:
        """Raw (batched) Direct Get; the messages before the end-of-batch status.

        Replies are collected by a subscription callback (one future for the whole
        batch, not a ``next_msg`` task per message).
        """
        api_subject = f"$JS.API.DIRECT.GET.{self.stream}{subject_suffix}"
        out: list[Msg] = []
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        single = "batch" not in payload

        async def on_reply(msg: Msg) -> None:
            if done.done():
                return
            status = (msg.headers or {}).get("Status")
            if status is None:
                out.append(msg)
                if single:
                    done.set_result(None)
            elif status in ("404", "204", "408"):
                done.set_result(None)
            else:
                done.set_exception(ReelError(f"direct get failed: {status} {(msg.headers or {}).get('Description')}"))

        sub = await self._nc.subscribe(self._nc.new_inbox(), cb=on_reply)
        fail_if_denied(self._nc, api_subject, done)  # a refused read fails now, not at the timeout
        try:
            await self._nc.publish(api_subject, json.dumps(payload).encode() if payload else b"", reply=sub.subject)
            await asyncio.wait_for(done, self._timeout_s)
        finally:
            await sub.unsubscribe()
        return out

    async def head_msg(self, key: str) -> Msg | None:
        """The key's last message (headers include ``Nats-Sequence``), or ``None``."""
        msgs = await self._direct_get({}, "." + self.subject_of(key))
        return msgs[0] if msgs else None

    async def first_seq(self, key: str) -> int | None:
        """Sequence of the key's first message, or ``None``."""
        msgs = await self._direct_get({"seq": 1, "next_by_subj": self.subject_of(key)})
        return msg_seq(msgs[0]) if msgs else None

    async def read_raw(self, key: str, *, upto_seq: int | None = None, from_seq: int = 0) -> list[tuple[int, bytes]]:
        """The key's ``(sequence, body)`` pairs with sequence in ``[from_seq, upto_seq]``, in order.

        ``upto_seq`` is enforced here (the server ignores ``up_to_seq`` for
        ``next_by_subj`` batches).
        """
        subject = self.subject_of(key)
        start = from_seq or 1
        out: list[tuple[int, bytes]] = []
        while True:
            batch = DIRECT_GET_BATCH if upto_seq is None else max(1, min(DIRECT_GET_BATCH, upto_seq - start + 1))
            msgs = await self._direct_get({"seq": start, "next_by_subj": subject, "batch": batch})
            for m in msgs:
                seq = msg_seq(m)
                if upto_seq is not None and seq > upto_seq:
                    return out
                out.append((seq, m.data))
            if len(msgs) < batch or int((msgs[-1].headers or {}).get("Nats-Num-Pending", "0")) == 0:
                return out
            start = msg_seq(msgs[-1]) + 1

    async def keys(self, prefix: str) -> list[str]:
        """Keys with at least one message (subjects under ``prefix`` in stream info)."""
        info = await self._js.stream_info(self.stream, subjects_filter=prefix + ">")
        return sorted(s[len(prefix):] for s in (info.state.subjects or {}))


class JetStreamEventLog:
    """The :class:`~shared.core.ports.EventLog` port: run commits on ``Names.events_stream``."""

    def __init__(self, nc: Client, names: Names, *, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.names = names
        self.subjects = SubjectLog(nc, names.events_stream, names.events, timeout_s=timeout_s)
        self._nc = nc
        self._snapshots: SnapshotStore | None = None
        self._snapshots_opened = False

    async def snapshots(self) -> SnapshotStore | None:
        """The namespace's snapshot store (opened once), or ``None`` if it has none."""
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
        return await self.subjects.append_async(run_id, body, expected_seq=expected_lsn, commit_id=cid)

    async def head(self, run_id: str) -> tuple[int, Commit] | None:
        """The run's last commit and its LSN, or ``None`` if the run has none.

        Reads take ``run_id`` from commands, so an id that is not one subject token
        (``*``, ``>``, ``a.b``) names no run: it must never be read as a subject
        pattern matching other runs.
        """
        if not is_token(run_id):
            return None
        msg = await self.subjects.head_msg(run_id)
        return None if msg is None else (msg_seq(msg), decode_commit(msg.data))

    async def first_lsn(self, run_id: str) -> int | None:
        """LSN of the run's first commit (its ``run_created``), or ``None`` (see :meth:`head`)."""
        return await self.subjects.first_seq(run_id) if is_token(run_id) else None

    async def read(self, run_id: str, *, upto_lsn: int | None = None, from_lsn: int = 0) -> list[tuple[int, Commit]]:
        """The run's commits with LSN in ``[from_lsn, upto_lsn]``, in order.

        An id that is not one subject token has no commits (see :meth:`head`).

        Raises:
            UnknownEventType: a commit holds an event this version cannot decode.
        """
        if not is_token(run_id):
            return []
        raw = await self.subjects.read_raw(run_id, upto_seq=upto_lsn, from_seq=from_lsn)
        with gc_paused():
            return [(lsn, decode_commit(body)) for lsn, body in raw]

    async def load(self, run_id: str, *, upto_lsn: int | None = None, cold: bool = False) -> folding.RunState:
        """The run's state folded up to ``upto_lsn`` (default: its head).

        Starts from the run's latest snapshot at or below ``upto_lsn`` when there is
        one (shared/nats/snapshots.py) and replays only the commits from the snapshot's
        LSN on — checking that the commit at that LSN is the one the snapshot was
        taken after; otherwise, or with ``cold``, it folds the whole run from its
        first commit. Both give the same state (tested byte for byte).

        Raises:
            RunNotFound: the run has no commit at or below ``upto_lsn``.
        """
        state = None if cold or not is_token(run_id) else await self._load_from_snapshot(run_id, upto_lsn)
        if state is None:
            commits = await self.read(run_id, upto_lsn=upto_lsn)
            with gc_paused():
                state = folding.fold(commits, upto_lsn)
        if state is None:
            raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
        return state

    async def _load_from_snapshot(self, run_id: str, upto_lsn: int | None) -> folding.RunState | None:
        store = await self.snapshots()
        ref = await store.latest(run_id) if store is not None else None
        if store is None or ref is None or (upto_lsn is not None and ref.lsn > upto_lsn):
            return None
        tail = await self.read(run_id, from_lsn=ref.lsn, upto_lsn=upto_lsn)
        if not tail or tail[0][0] != ref.lsn or tail[0][1].commit_id != ref.commit_id:
            log.warning("snapshot.mismatch", run_id=run_id, lsn=ref.lsn)
            return None
        state = await store.state(ref)
        if state is None or state.head_lsn != ref.lsn:
            return None
        with gc_paused():
            return folding.fold(tail[1:], start=state)

    async def refresh(self, state: folding.RunState) -> tuple[folding.RunState, list[tuple[int, Commit]]]:
        """Bring a folded ``state`` up to the run's head by applying only the commits above it.

        Returns the state at the new head (``state`` itself when nothing is new; ``state`` is
        never changed) and the commits applied, in order.
        """
        new = await self.read(state.run_id, from_lsn=state.head_lsn + 1)
        with gc_paused():
            after = folding.fold(new, start=state)
        return (state if after is None else after), new

    async def list_runs(self) -> list[str]:
        """Run ids that have at least one commit."""
        return await self.subjects.keys(self.names.events(""))


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


def msg_seq(msg: Msg) -> int:
    """The stream sequence of a Direct Get reply."""
    return int((msg.headers or {})["Nats-Sequence"])


if TYPE_CHECKING:
    _port: type[EventLog] = JetStreamEventLog  # the adapter satisfies its port (mypy checks it)
