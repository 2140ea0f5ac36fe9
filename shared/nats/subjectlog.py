"""A guarded, per-key append-only log of opaque bodies on one JetStream stream.

:class:`SubjectLog`: ``subject_of(key)`` is one subject per key. Writes are fenced with
``Nats-Expected-Last-Subject-Sequence`` (the sequence the writer last saw; ``0`` for a
new key) and carry a commit id as ``Nats-Msg-Id`` (a retried publish is deduplicated).
Reads use batched Direct Get on the key's own subject, starting at its first sequence,
so replaying one key costs O(its messages), not O(stream). The run event log
(:mod:`reel.shared.nats.eventlog`), crucible's session log and the verdict stream's readers use it.

**On a replicated stream (R3)** a Direct Get may be answered by a follower that has
not applied the latest writes yet, and a publish in flight during a leader election times out
or finds no responders. So:

* each log remembers, per key, the highest sequence it knows exists (its own acks, a fence's
  ``wrong last sequence: N``, what it read, :meth:`SubjectLog.note`); a read whose answer stops
  short of it reads the missing tail from the stream leader (``$JS.API.STREAM.MSG.GET``, served
  by the leader only), so a writer always reads its own writes and a reader never goes back;
* a pinned read (``expect_seq``: an LSN the caller knows is the key's) is checked the same way;
* a publish that times out or finds no responders is sent again with the *same* ``Nats-Msg-Id``
  and expectation until it settles (:data:`SETTLE_S`, tenacity); the answer is a duplicate ack
  with the first sequence (R3), or ``wrong last sequence`` (R1), resolved by finding the commit
  id among the key's messages above the expectation.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NotFoundError

from reel.shared.core.errors import ConcurrencyConflict, ReelError
from reel.shared.core.run.ids import new_commit_id
from reel.shared.core.wire.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER, MSG_ID_HEADER
from reel.shared.nats.directget import direct_replies
from reel.shared.nats.publish import is_transient, request_ack, settle_retrying, settled

WRONG_LAST_SEQUENCE = 10071
RACING_WRITE = 10164  # clustered: a write racing an in-flight one on the same subject
DIRECT_GET_BATCH = 256
READ_TIMEOUT_S = 10.0
COMMIT_ID_HEADER = "Reel-Commit-Id"
log = structlog.get_logger(__name__)
KNOWN_KEYS_MAX = 65_536  # keys whose highest known sequence a log remembers (least recently used dropped)
_WRONG_SEQ = re.compile(r"wrong last sequence: (\d+)")


@dataclass(frozen=True)
class StoredMsg:
    """One message of the stream as the leader answered it (``$JS.API.STREAM.MSG.GET``)."""

    seq: int
    data: bytes
    headers: dict[str, str]


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
        self.subject_of = functools.lru_cache(maxsize=KNOWN_KEYS_MAX)(subject_of)  # one string per key, built once
        self._timeout_s = timeout_s
        self._known: OrderedDict[str, int] = OrderedDict()

    def note(self, key: str, seq: int) -> None:
        """Remember that ``key`` has a message at stream sequence ``seq`` (reads then never return less)."""
        if seq > self._known.get(key, 0):
            self._known[key] = seq
        if key in self._known:
            self._known.move_to_end(key)
            if len(self._known) > KNOWN_KEYS_MAX:
                self._known.popitem(last=False)

    def known(self, key: str) -> int:
        """The highest sequence of ``key`` this log knows exists (0: none)."""
        return self._known.get(key, 0)

    def _headers(self, cid: str, expected_seq: int) -> dict[str, str]:
        return {MSG_ID_HEADER: cid, EXPECTED_LAST_SUBJECT_SEQ_HEADER: str(expected_seq), COMMIT_ID_HEADER: cid}

    async def append_async(self, key: str, body: bytes, *, expected_seq: int,
                           commit_id: str | None = None) -> asyncio.Future[int]:
        """Send one message now; the future resolves to its sequence (see :meth:`append`)."""
        cid = commit_id or new_commit_id()
        headers = self._headers(cid, expected_seq)
        ack = request_ack(self._nc, self.subject_of(key), body, headers, self._timeout_s)
        return asyncio.ensure_future(self._settle(key, cid, expected_seq, ack, body, headers))

    async def append(self, key: str, body: bytes, *, expected_seq: int, commit_id: str | None = None) -> int:
        """Append one message to the key's subject, fenced on ``expected_seq``; returns its sequence.

        Raises:
            ConcurrencyConflict: (or the ``conflict`` error) the key's last sequence is not
                ``expected_seq`` and the head is not this very commit (a retry that landed).
        """
        return await (await self.append_async(key, body, expected_seq=expected_seq, commit_id=commit_id))

    async def _settle(self, key: str, cid: str, expected_seq: int, ack_wait: Awaitable[PubAck], body: bytes,
                      headers: dict[str, str]) -> int:
        """The sequence the commit ``cid`` landed at: the first ack, else the same message sent again
        (same ``Nats-Msg-Id``) while the stream has no leader, until it settles (see module doc)."""
        resent = False
        try:
            try:
                ack = await ack_wait
            except Exception as exc:
                if not is_transient(exc):
                    raise
                resent = True
                ack = await self._resend(key, body, headers, exc)
        except APIError as exc:
            if exc.err_code not in (WRONG_LAST_SEQUENCE, RACING_WRITE):
                raise
            if m := _WRONG_SEQ.search(exc.description or ""):
                self.note(key, int(m.group(1)))
            landed = await self._landed(key, cid, expected_seq, deep=resent or exc.err_code == RACING_WRITE)
            if landed is not None:
                return landed  # our earlier publish of this commit landed
            head = self.known(key)
            raise self._conflict(key, f"{key} moved past sequence {expected_seq} (now {head})", expected_seq) from exc
        self.note(key, int(ack.seq))
        return int(ack.seq)

    async def _resend(self, key: str, body: bytes, headers: dict[str, str], first: BaseException) -> PubAck:
        """Publish the same message again until an answer that is not transient (tenacity, :data:`SETTLE_S`).

        Raises:
            APIError: the answer was a refusal (e.g. 10071: resolved by the caller).
            Exception: the last transient error, once the settle window is over.
        """
        log.warning("commit.resend", key=key, stream=self.stream, error=repr(first)[:200])
        async for attempt in settle_retrying():
            with attempt:
                return await request_ack(self._nc, self.subject_of(key), body, headers, self._timeout_s)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _landed(self, key: str, cid: str, expected_seq: int, *, deep: bool) -> int | None:
        """The sequence of commit ``cid`` among ``key``'s messages above ``expected_seq`` (the head only unless
        ``deep``: after a resend another commit may already sit on top of ours), or ``None``."""
        if not deep:
            head = await self.head_msg(key)
            if head is not None and (head.headers or {}).get(COMMIT_ID_HEADER) == cid:
                return msg_seq(head)
            return None
        for seq, hdrs in await self._read_headers(key, expected_seq + 1):
            if hdrs.get(COMMIT_ID_HEADER) == cid:
                return seq
        return None

    async def _read_headers(self, key: str, from_seq: int) -> list[tuple[int, dict[str, str]]]:
        """``(sequence, headers)`` of ``key``'s messages from ``from_seq`` on, as the stream leader has them."""
        out: list[tuple[int, dict[str, str]]] = []
        seq = from_seq
        while (m := await self._leader_get(seq=seq, next_by_subj=self.subject_of(key))) is not None:
            out.append((m.seq, m.headers))
            self.note(key, m.seq)
            seq = m.seq + 1
        return out

    async def _leader_get(self, *, seq: int | None = None, next_by_subj: str | None = None,
                          last_by_subj: str | None = None) -> StoredMsg | None:
        """One message from the stream leader (``$JS.API.STREAM.MSG.GET``), ``None`` if there is none;
        retried while the stream has no leader."""
        async for attempt in settle_retrying():
            with attempt:
                try:
                    if last_by_subj is not None:
                        raw = await self._js.get_msg(self.stream, subject=last_by_subj)
                    else:
                        raw = await self._js.get_msg(self.stream, seq=seq, subject=next_by_subj, next=True)
                except NotFoundError:
                    return None
                return StoredMsg(int(raw.seq or 0), raw.data or b"", dict(raw.headers or {}))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _direct_get(self, payload: dict[str, object], subject_suffix: str = "") -> list[Msg]:
        """:meth:`_direct_get_once`, asked again while the stream cannot answer (an election: :func:`settled`)."""
        return await settled(lambda: self._direct_get_once(payload, subject_suffix))

    async def _direct_get_once(self, payload: dict[str, object], subject_suffix: str = "") -> list[Msg]:
        """Raw (batched) Direct Get; the messages before the end-of-batch status.

        Replies arrive on the connection's one Direct Get reply subscription
        (:mod:`reel.shared.nats.directget`: no subscription per read, no ``next_msg`` task per message).
        """
        return await direct_replies(self._nc).get(
            f"$JS.API.DIRECT.GET.{self.stream}{subject_suffix}", json.dumps(payload).encode() if payload else b"",
            single="batch" not in payload, timeout_s=self._timeout_s)

    async def head_msg(self, key: str) -> Msg | None:
        """The key's last message (headers include ``Nats-Sequence``), or ``None``.

        An answer older than the key's known sequence (a lagging follower) is asked again of the leader.
        """
        msgs = await self._direct_get({}, "." + self.subject_of(key))
        if (msg_seq(msgs[0]) if msgs else 0) < self.known(key):
            stored = await self._leader_get(last_by_subj=self.subject_of(key))
            msgs = [] if stored is None else [_as_msg(self._nc, self.subject_of(key), stored)]
        if msgs:
            self.note(key, msg_seq(msgs[0]))
        return msgs[0] if msgs else None

    async def last_seqs(self, keys: Sequence[str]) -> dict[str, int]:
        """The sequence of each key's last message (keys with none are left out), in one batched Direct Get per
        :data:`DIRECT_GET_BATCH` keys (``multi_last``) rather than one read per key. An answer may come from a
        replica that is behind: never above the key's real last sequence, possibly below it."""
        out: dict[str, int] = {}
        by_subject = {self.subject_of(k): k for k in keys}
        subjects = list(by_subject)
        for i in range(0, len(subjects), DIRECT_GET_BATCH):
            part = subjects[i:i + DIRECT_GET_BATCH]
            for m in await self._direct_get({"multi_last": part, "batch": len(part)}):
                key = by_subject.get((m.headers or {}).get("Nats-Subject", ""))
                if key is not None:
                    out[key] = max(out.get(key, 0), msg_seq(m))
        return out

    async def first_seq(self, key: str) -> int | None:
        """Sequence of the key's first message, or ``None`` (asked of the leader if the key is known to exist)."""
        msgs = await self._direct_get({"seq": 1, "next_by_subj": self.subject_of(key)})
        if msgs:
            return msg_seq(msgs[0])
        if self.known(key):
            stored = await self._leader_get(seq=1, next_by_subj=self.subject_of(key))
            return None if stored is None else stored.seq
        return None

    async def read_raw(self, key: str, *, upto_seq: int | None = None, from_seq: int = 0,
                       expect_seq: int | None = None) -> list[tuple[int, bytes]]:
        """The key's ``(sequence, body)`` pairs with sequence in ``[from_seq, upto_seq]``, in order.

        ``upto_seq`` is enforced here (the server ignores ``up_to_seq`` for
        ``next_by_subj`` batches). The answer reaches at least the key's known sequence (capped at
        ``upto_seq``) and ``expect_seq`` (a sequence the caller knows exists, e.g. a pinned LSN): when the
        replica that answered is behind, the missing tail is read from the stream leader.
        """
        out, beyond = await self._read_direct(key, upto_seq, from_seq)
        need = max(self.known(key), expect_seq or 0)
        if upto_seq is not None:
            need = min(need, upto_seq)
        last = out[-1][0] if out else 0
        if not beyond and last < need:
            seq = max(last + 1, from_seq or 1)
            while (m := await self._leader_get(seq=seq, next_by_subj=self.subject_of(key))) is not None:
                if upto_seq is not None and m.seq > upto_seq:
                    break
                out.append((m.seq, m.data))
                seq = m.seq + 1
        if out:
            self.note(key, out[-1][0])
        return out

    async def _read_direct(self, key: str, upto_seq: int | None, from_seq: int
                           ) -> tuple[list[tuple[int, bytes]], bool]:
        """Batched Direct Get of the key's messages in ``[from_seq, upto_seq]``; and whether the replica
        that answered has a message above ``upto_seq`` (then it has everything up to it)."""
        subject = self.subject_of(key)
        start = from_seq or 1
        out: list[tuple[int, bytes]] = []
        while True:
            batch = DIRECT_GET_BATCH if upto_seq is None else max(1, min(DIRECT_GET_BATCH, upto_seq - start + 1))
            msgs = await self._direct_get({"seq": start, "next_by_subj": subject, "batch": batch})
            for m in msgs:
                seq = msg_seq(m)
                if upto_seq is not None and seq > upto_seq:
                    self.note(key, seq)
                    return out, True
                out.append((seq, m.data))
            if not msgs or int((msgs[-1].headers or {}).get("Nats-Num-Pending", "0")) == 0:
                return out, False
            start = msg_seq(msgs[-1]) + 1

    async def keys(self, prefix: str) -> list[str]:
        """Keys with at least one message (subjects under ``prefix`` in stream info)."""
        info = await self._js.stream_info(self.stream, subjects_filter=prefix + ">")
        return sorted(s[len(prefix):] for s in (info.state.subjects or {}))


def _as_msg(nc: Client, subject: str, stored: StoredMsg) -> Msg:
    """A leader's answer in the shape of a Direct Get reply (``Nats-Sequence`` among the headers)."""
    return Msg(_client=nc, subject=subject, data=stored.data, headers={**stored.headers,
                                                                       "Nats-Sequence": str(stored.seq)})


def msg_seq(msg: Msg) -> int:
    """The stream sequence of a Direct Get reply."""
    return int((msg.headers or {})["Nats-Sequence"])
