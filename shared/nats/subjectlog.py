"""A guarded, per-key append-only log of opaque bodies on one JetStream stream (brief §4).

:class:`SubjectLog`: ``subject_of(key)`` is one subject per key. Writes are fenced with
``Nats-Expected-Last-Subject-Sequence`` (the sequence the writer last saw; ``0`` for a
new key) and carry a commit id as ``Nats-Msg-Id`` (a retried publish is deduplicated).
Reads use batched Direct Get on the key's own subject, starting at its first sequence,
so replaying one key costs O(its messages), not O(stream). The run event log
(:mod:`shared.nats.eventlog`), crucible's session log and the verdict stream's readers use it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

from shared.core.errors import ConcurrencyConflict, ReelError
from shared.core.ids import new_commit_id
from shared.core.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER, MSG_ID_HEADER
from shared.nats.access import fail_if_denied
from shared.nats.publish import request_ack

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


def msg_seq(msg: Msg) -> int:
    """The stream sequence of a Direct Get reply."""
    return int((msg.headers or {})["Nats-Sequence"])
