"""The event log: one JetStream stream, one subject per run, LSN = stream sequence (brief §4).

Writes are guarded commits (one writer per run): each message is published with
``Nats-Expected-Last-Subject-Sequence`` (the LSN the writer last saw; ``0`` for a
new run) and ``Nats-Msg-Id`` (the commit id, so a retried publish is
deduplicated). Reads use batched Direct Get on the run's own subject, starting at
the run's first LSN, so replaying a run costs O(its commits), not O(stream).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Protocol

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

from shared import fold as folding
from shared.errors import ConcurrencyConflict, ReelError, RunNotFound
from shared.events import AnyEvent, Commit, decode_commit, encode_commit
from shared.ids import new_commit_id
from shared.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER, MSG_ID_HEADER, Names

log = structlog.get_logger(__name__)

WRONG_LAST_SEQUENCE = 10071
RACING_WRITE = 10164  # clustered: a write racing an in-flight one on the same subject
DIRECT_GET_BATCH = 256
READ_TIMEOUT_S = 10.0


class EventLog(Protocol):
    """Port for the run event log."""

    async def commit(
        self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
        commit_id: str | None = None,
    ) -> int: ...

    async def read(self, run_id: str, *, upto_lsn: int | None = None, from_lsn: int = 0) -> list[tuple[int, Commit]]:
        ...

    async def head(self, run_id: str) -> tuple[int, Commit] | None: ...


class JetStreamEventLog:
    """:class:`EventLog` on a JetStream stream (``Names.events_stream``)."""

    def __init__(self, nc: Client, names: Names, *, timeout_s: float = READ_TIMEOUT_S) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self._names = names
        self._timeout_s = timeout_s

    # ---- writes ------------------------------------------------------------
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
        fut = await self.commit_async(run_id, events, expected_lsn=expected_lsn, writer=writer, commit_id=commit_id)
        return await fut

    async def commit_async(
        self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
        commit_id: str | None = None,
    ) -> asyncio.Future[int]:
        """Send the commit now; the returned future resolves to its LSN (see :meth:`commit`).

        Lets a caller pipeline the commit with other publishes (e.g. a blob) and
        await all acks together.
        """
        cid = commit_id or new_commit_id()
        body = encode_commit(Commit(commit_id=cid, run_id=run_id, writer=writer, events=tuple(events)))
        headers = {MSG_ID_HEADER: cid, EXPECTED_LAST_SUBJECT_SEQ_HEADER: str(expected_lsn)}
        ack_fut = publish_pipelined(self._nc, self._names.events(run_id), body, headers, self._timeout_s)
        return asyncio.ensure_future(self._settle(run_id, cid, expected_lsn, ack_fut))

    async def _settle(self, run_id: str, cid: str, expected_lsn: int, ack_fut: asyncio.Future[PubAck]) -> int:
        try:
            ack = await ack_fut
        except APIError as exc:
            if exc.err_code not in (WRONG_LAST_SEQUENCE, RACING_WRITE):
                raise
            head = await self.head(run_id)
            if head is not None and head[1].commit_id == cid:
                return head[0]  # our earlier publish of this commit landed
            raise ConcurrencyConflict(
                f"run {run_id} moved past LSN {expected_lsn} (now {head[0] if head else 0})",
                run_id=run_id, expected_lsn=expected_lsn,
            ) from exc
        return int(ack.seq)

    # ---- reads -------------------------------------------------------------
    async def _direct_get(self, payload: dict[str, object], subject_suffix: str = "") -> list[Msg]:
        """Raw (batched) Direct Get; returns the messages before the end-of-batch status."""
        stream = self._names.events_stream
        api_subject = f"$JS.API.DIRECT.GET.{stream}{subject_suffix}"
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        out: list[Msg] = []
        try:
            await self._nc.publish(api_subject, json.dumps(payload).encode() if payload else b"", reply=inbox)
            while True:
                msg = await sub.next_msg(timeout=self._timeout_s)
                status = (msg.headers or {}).get("Status")
                if status is not None:
                    if status in ("404", "204", "408"):
                        return out
                    raise ReelError(f"direct get failed: {status} {(msg.headers or {}).get('Description')}")
                out.append(msg)
                if "batch" not in payload:
                    return out
        finally:
            await sub.unsubscribe()

    async def head(self, run_id: str) -> tuple[int, Commit] | None:
        """The run's last commit and its LSN, or ``None`` if the run has none."""
        msgs = await self._direct_get({}, "." + self._names.events(run_id))
        if not msgs:
            return None
        return _lsn(msgs[0]), decode_commit(msgs[0].data)

    async def first_lsn(self, run_id: str) -> int | None:
        """LSN of the run's first commit (its ``run_created``), or ``None``."""
        msgs = await self._direct_get({"seq": 1, "next_by_subj": self._names.events(run_id)})
        return _lsn(msgs[0]) if msgs else None

    async def read(self, run_id: str, *, upto_lsn: int | None = None, from_lsn: int = 0) -> list[tuple[int, Commit]]:
        """The run's commits with LSN in ``[from_lsn, upto_lsn]``, in order.

        ``from_lsn`` defaults to the run's first LSN; pass it when known (e.g. a
        run's ``created_lsn``) to save one round trip. ``upto_lsn`` is enforced
        here (the server ignores ``up_to_seq`` for ``next_by_subj`` batches).
        """
        subject = self._names.events(run_id)
        start = from_lsn or 1
        out: list[tuple[int, Commit]] = []
        while True:
            msgs = await self._direct_get({"seq": start, "next_by_subj": subject, "batch": DIRECT_GET_BATCH})
            for m in msgs:
                lsn = _lsn(m)
                if upto_lsn is not None and lsn > upto_lsn:
                    return out
                out.append((lsn, decode_commit(m.data)))
            if len(msgs) < DIRECT_GET_BATCH or int((msgs[-1].headers or {}).get("Nats-Num-Pending", "0")) == 0:
                return out
            start = _lsn(msgs[-1]) + 1

    async def load(self, run_id: str, *, upto_lsn: int | None = None) -> folding.RunState:
        """Cold re-fold of one run (up to ``upto_lsn``).

        Raises:
            RunNotFound: the run has no commit at or below ``upto_lsn``.
        """
        state = folding.fold(await self.read(run_id, upto_lsn=upto_lsn), upto_lsn)
        if state is None:
            raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
        return state

    async def list_runs(self) -> list[str]:
        """Run ids that have at least one commit (uses stream info's subject list)."""
        info = await self._js.stream_info(self._names.events_stream, subjects_filter=self._names.events_all)
        prefix = self._names.events("")
        return sorted(s[len(prefix):] for s in (info.state.subjects or {}))


def publish_pipelined(
    nc: Client, subject: str, body: bytes, headers: dict[str, str] | None, timeout_s: float
) -> asyncio.Future[PubAck]:
    """Publish to a stream subject now; the future resolves to the PubAck.

    Several of these in flight at once share one round trip. (nats-py's own
    ``publish_async`` cannot be used: it loses error acks such as 10071.)

    Raises (from the future):
        nats.js.errors.APIError: the server refused the message (e.g. 10071).
        nats.errors.TimeoutError: no ack within ``timeout_s``.
    """

    async def go() -> PubAck:
        resp = await nc.request(subject, body, timeout=timeout_s, headers=headers)
        data = json.loads(resp.data)
        if "error" in data:
            APIError.from_error(data["error"])  # raises the typed subclass
        return PubAck.from_response(data)

    return asyncio.ensure_future(go())


def _lsn(msg: Msg) -> int:
    return int((msg.headers or {})["Nats-Sequence"])


def decode_payload(data: bytes) -> Commit:
    """Decode a commit body (alias of :func:`shared.events.decode_commit`, for readers of raw messages)."""
    return decode_commit(data)


__all__ = ["ConcurrencyConflict", "EventLog", "JetStreamEventLog", "decode_payload", "msgspec"]
