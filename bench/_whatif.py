"""What-if variants used by the benchmarks' ``--experiments`` (NOT what Reel does today).

Each is a local, measured proposal for a change to ``shared/`` or ``services/``;
the benchmarks check that it gives byte-identical results before timing it.

* :func:`fold_o1` / :func:`build_view_one_pass` — the fold with an O(1) step lookup
  and type-dispatched hot path, and ``build_episode_view`` computing step statuses
  in one pass (today both are O(steps) per event/step, i.e. O(n²) per run).
* :func:`next_action_one_pass`, :func:`memo_candidates` — the executor's planner in
  one pass (today O(steps²) per call) and token counts memoized per text.
* :func:`read_direct_get_cb` — batched Direct Get collecting replies in a
  subscription callback instead of one ``next_msg`` (a Task + ``wait_for``) per message.
* :func:`read_ordered_consumer` — an ordered push consumer on the run's subject.
* :class:`AckBatch` — the messages of one round trip published together, all acks
  awaited through one future (today: one Task + request future + timer per message).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as jsapi

from shared import execution as plan
from shared import fold as folding
from shared import views
from shared.blobstore import CHUNK_BYTES, ref_for
from shared.errors import InvalidTransition, ReelError
from shared.eventlog import DIRECT_GET_BATCH, msg_seq
from shared.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    Commit,
    RunCreated,
    Usage,
)
from shared.packer import Candidate
from shared.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER
from shared.tokens import TokenCounter
from shared.workflow import ContextItemSpec

Outgoing = tuple[str, bytes, dict[str, str] | None]  # subject, body, headers

# ---- fold / view -------------------------------------------------------------------------------------

_step_pos: dict[int, tuple[object, dict[str, int]]] = {}


def _positions(state: folding.RunState) -> dict[str, int]:
    """step id → index; in a real change this would live on RunState (``dict=True``, not encoded)."""
    hit = _step_pos.get(id(state.steps))
    if hit is None or hit[0] is not state.steps:
        hit = (state.steps, {d.step_id: i for i, d in enumerate(state.steps)})
        _step_pos[id(state.steps)] = hit
    return hit[1]


def _dispatched(state: folding.RunState, lsn: int, event: AttemptDispatched) -> None:
    branch = state.branches.get(event.branch_id)
    if branch is None:
        raise InvalidTransition(f"dispatch on unknown branch {event.branch_id!r}", run_id=state.run_id)
    if event.step_id not in _positions(state):
        raise InvalidTransition(f"dispatch of undeclared step {event.step_id!r}", run_id=state.run_id)
    if state.status == "pending":
        state.status = "running"
    branch.attempts.setdefault(event.step_id, []).append(folding.AttemptState(
        step_id=event.step_id, attempt=event.attempt, status="dispatched", executor_id=event.executor_id,
        dispatched_lsn=lsn, dispatched_ms=event.at_ms, prompt_ref=event.prompt_ref, context=event.context,
    ))


def _succeeded(state: folding.RunState, lsn: int, event: AttemptSucceeded) -> None:
    a = folding._attempt(state, event.branch_id, event.step_id, event.attempt)
    a.status, a.outcome_lsn, a.finished_ms = "succeeded", lsn, event.at_ms
    a.output_ref, a.usage, a.recovered = event.output_ref, event.usage, event.recovered


def _failed(state: folding.RunState, lsn: int, event: AttemptFailed) -> None:
    a = folding._attempt(state, event.branch_id, event.step_id, event.attempt)
    a.status, a.outcome_lsn, a.finished_ms = "failed", lsn, event.at_ms
    a.error_kind, a.error_message, a.retryable = event.error_kind, event.message, event.retryable
    a.usage, a.recovered = event.usage, event.recovered


_HOT = {AttemptDispatched: _dispatched, AttemptSucceeded: _succeeded, AttemptFailed: _failed}


def fold_o1(commits: Iterable[tuple[int, Commit]]) -> folding.RunState | None:
    """Same result as :func:`shared.fold.fold` (checked byte for byte by the benchmark)."""
    state: folding.RunState | None = None
    hot = _HOT
    for lsn, commit in commits:
        events: tuple[AnyEvent, ...] = commit.events
        if state is None:
            if not events or not isinstance(events[0], RunCreated):
                raise InvalidTransition("a run's first commit must start with run_created", run_id=commit.run_id)
            state, events = folding.create(lsn, events[0]), events[1:]
        for event in events:
            h = hot.get(type(event))
            if h is not None:
                h(state, lsn, event)  # type: ignore[operator]
            else:
                folding.apply(state, lsn, event)
        state.head_lsn = lsn
        state.commits += 1
    return state


def build_view_one_pass(state: folding.RunState, branch_id: str | None = None) -> views.EpisodeView:
    """Same result as :func:`shared.views.build_episode_view`, step statuses in one pass."""
    bid = branch_id or state.active_branch
    branch = state.branches[bid]
    steps: list[views.StepView] = []
    tin = tout = 0
    lat = cost = 0.0
    failed_before = False
    for decl in state.steps:
        attempts = branch.attempts.get(decl.step_id, [])
        last = len(attempts) - 1
        out = []
        for i, a in enumerate(attempts):
            out.append(views.AttemptView(
                step_id=a.step_id, attempt=a.attempt, status=a.status,
                superseded=a.status == "dispatched" and i < last,
                executor_id=a.executor_id, dispatched_lsn=a.dispatched_lsn, outcome_lsn=a.outcome_lsn,
                prompt_ref=a.prompt_ref, output_ref=a.output_ref, context=a.context, usage=a.usage,
                error_kind=a.error_kind, error_message=a.error_message, recovered=a.recovered,
            ))
            u = a.usage
            tin, tout, lat, cost = tin + u.input_tokens, tout + u.output_tokens, lat + u.latency_ms, cost + u.cost_usd
        own = folding._own_status(state, branch, decl)
        steps.append(views.StepView(step_id=decl.step_id, kind=decl.kind,
                                    status="skipped" if failed_before else own, attempts=tuple(out)))
        failed_before = failed_before or own == "failed"
    return views.EpisodeView(
        run_id=state.run_id, workflow_name=state.workflow_name, branch_id=bid, snapshot_lsn=state.head_lsn,
        status=state.status, lineage=views._lineage(state, bid), steps=tuple(steps),
        verdicts=tuple(v for v in state.verdicts if v.branch_id == bid),
        usage=Usage(input_tokens=tin, output_tokens=tout, latency_ms=lat, cost_usd=cost),
    )


# ---- executor planning / packing -----------------------------------------------------------------------

def next_action_one_pass(state: folding.RunState, executor_id: str) -> plan.Action:
    """Same decision as :func:`shared.execution.next_action` in O(steps) instead of O(steps²)."""
    if state.status not in ("pending", "running"):
        return plan.Rest(state.status)
    if state.executor_id != executor_id:
        return plan.Claim()
    bid = state.active_branch
    branch = state.branches[bid]
    for decl in state.steps:
        own = folding._own_status(state, branch, decl)
        if own == "succeeded":
            continue
        if own == "failed":
            break  # every later step is skipped: the branch is terminal
        attempts = branch.attempts.get(decl.step_id, [])
        return plan.Dispatch(bid, decl.step_id, attempts[-1].attempt + 1 if attempts else 1)
    return plan.EnterVerifying(bid)


@functools.lru_cache(maxsize=8192)
def _measure(counter: TokenCounter, text: str) -> tuple[int, str]:
    return counter.count(text), plan.content_hash(text)


def memo_candidates(items: list[tuple[ContextItemSpec, str]], counter: TokenCounter) -> list[Candidate]:
    """:func:`shared.execution.candidates` with token count + hash memoized per text (identical output)."""
    out = []
    for i, text in items:
        tokens, digest = _measure(counter, text)
        out.append(Candidate(id=i.id, kind=i.kind, tokens=tokens, priority=i.priority, stale=i.stale,
                             content_hash=digest))
    return out


# ---- reading one subject ----------------------------------------------------------------------------------

async def _direct_get_cb(nc: Client, stream: str, payload: dict[str, object], timeout_s: float) -> list[Msg]:
    inbox = nc.new_inbox()
    out: list[Msg] = []
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def collect(msg: Msg) -> None:
        status = (msg.headers or {}).get("Status")
        if status is None:
            out.append(msg)
        elif not done.done():
            done.set_result(status)

    sub = await nc.subscribe(inbox, cb=collect, pending_msgs_limit=4 * DIRECT_GET_BATCH)
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(payload).encode(), reply=inbox)
        status = await asyncio.wait_for(done, timeout_s)
        if status not in ("404", "204", "408"):
            raise ReelError(f"direct get failed: {status}")
        return out
    finally:
        await sub.unsubscribe()


async def read_direct_get_cb(nc: Client, stream: str, subject: str, *, from_seq: int = 1,
                             timeout_s: float = 10.0) -> list[tuple[int, bytes]]:
    """Like ``SubjectLog.read_raw`` but replies are collected by a callback."""
    out: list[tuple[int, bytes]] = []
    start = from_seq
    while True:
        msgs = await _direct_get_cb(nc, stream, {"seq": start, "next_by_subj": subject, "batch": DIRECT_GET_BATCH},
                                    timeout_s)
        out.extend((msg_seq(m), m.data) for m in msgs)
        if len(msgs) < DIRECT_GET_BATCH or int((msgs[-1].headers or {}).get("Nats-Num-Pending", "0")) == 0:
            return out
        start = msg_seq(msgs[-1]) + 1


async def read_ordered_consumer(js: JetStreamContext, subject: str, *, from_seq: int = 1,
                                timeout_s: float = 60.0) -> list[tuple[int, bytes]]:
    """The subject's messages from ``from_seq`` through an ordered push consumer (callback)."""
    out: list[tuple[int, bytes]] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def collect(msg: Msg) -> None:
        md = msg.metadata
        out.append((md.sequence.stream, msg.data))
        if md.num_pending == 0 and not done.done():
            done.set_result(None)

    config = jsapi.ConsumerConfig(deliver_policy=jsapi.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq)
    sub = await js.subscribe(subject, cb=collect, ordered_consumer=True, config=config)
    try:
        await asyncio.wait_for(done, timeout_s)
    finally:
        await sub.unsubscribe()
    return out


# ---- publishing: one ack future per round trip ------------------------------------------------------------

class AckBatch:
    """Publish several messages and await all their JetStream acks with one future.

    Today every pipelined publish is an ``nc.request`` wrapped in a Task, each
    with its own future and ``wait_for`` timer; here one wildcard inbox
    subscription resolves one future per batch.
    """

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._prefix = nc.new_inbox()
        self._n = 0
        self._pending: dict[str, tuple[asyncio.Future[list[bytes]], list[bytes], list[int], int]] = {}

    async def start(self) -> AckBatch:
        await self._nc.subscribe(self._prefix + ".*", cb=self._on_ack)
        return self

    async def _on_ack(self, msg: Msg) -> None:
        entry = self._pending.pop(msg.subject, None)
        if entry is None:
            return
        fut, results, left, i = entry
        results[i] = msg.data
        left[0] -= 1
        if left[0] == 0 and not fut.done():
            fut.set_result(results)

    async def publish(self, items: list[Outgoing], timeout_s: float = 10.0) -> list[dict[str, object]]:
        """Send all ``(subject, body, headers)`` now; the parsed acks in order.

        Raises:
            ReelError: a message was refused (the first error).
        """
        fut: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()
        results: list[bytes] = [b""] * len(items)
        left = [len(items)]
        for i, (subject, body, headers) in enumerate(items):
            self._n += 1
            inbox = f"{self._prefix}.{self._n}"
            self._pending[inbox] = (fut, results, left, i)
            await self._nc.publish(subject, body, reply=inbox, headers=headers)
        acks = [json.loads(r) for r in await asyncio.wait_for(fut, timeout_s)]
        for a in acks:
            if "error" in a:
                raise ReelError(f"publish refused: {a['error']}")
        return acks


def small_blob_messages(nc: Client, bucket: str, data: bytes,
                        media_type: str = "text/plain") -> tuple[BlobRef, list[Outgoing]]:
    """The chunk + meta messages ``JetStreamBlobStore._put_small`` sends (NATS ADR-20), and the ref."""
    ref = ref_for(data, media_type)
    nuid = nc._nuid.next().decode()
    meta = {
        "name": ref.sha256, "bucket": bucket, "nuid": nuid, "size": len(data), "chunks": 1,
        "mtime": datetime.now(UTC).isoformat(),
        "digest": "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode(),
        "headers": {"Content-Type": [media_type]}, "options": {"max_chunk_size": CHUNK_BYTES},
    }
    meta_subject = f"$O.{bucket}.M.{base64.urlsafe_b64encode(ref.sha256.encode()).decode()}"
    return ref, [
        (f"$O.{bucket}.C.{nuid}", data, None),
        (meta_subject, json.dumps(meta).encode(), {jsapi.Header.ROLLUP: "sub", EXPECTED_LAST_SUBJECT_SEQ_HEADER: "0"}),
    ]
