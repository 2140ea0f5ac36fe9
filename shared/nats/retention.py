"""Enforcing a namespace's retention policy, and collecting blobs no kept run references (docs/operations.md,
"Retention and archives").

:func:`sweep` reads every run of the events stream once (its commits, folded), drops the runs the policy lets go
(:func:`reel.shared.core.run.retention.expired`: finished, not pinned, past ``keep_days`` and not among the
``keep_newest``; a live or corrupt run is never dropped) with :func:`~reel.shared.nats.archive.purge_run`, then
collects blobs (:func:`collect_blobs`).

**The collector's guard** against a writer about to reference a blob it judged garbage:

1. *Mark*: the events stream's last sequence S is read first, then the whole stream once (one ordered consumer:
   every run's commits, folded per run) and the blobs every kept run's commits, every crucible session's records
   and the snapshot and outcome-marker buckets (a state snapshot; an output recorded before its commit) reference.
2. *Candidates*: live objects not marked whose meta record is older than ``grace_s`` — a writer's put of a body
   that exists already writes its meta record again (:meth:`JetStreamBlobStore._touch`), so a body put within the
   grace is young, and a writer's cache of stored names lasts :data:`~reel.shared.nats.blobread.KNOWN_TTL_S`,
   less than the grace.
3. *Re-check*: every commit appended after S is read and what it references is no longer a candidate (a commit
   that landed while the mark ran).
4. *Delete, fenced*: each candidate's delete marker is published with ``Nats-Expected-Last-Subject-Sequence`` = the
   meta record judged in 2; a touch since then fails it (10071) and the blob is kept. Then its chunks and the
   marker itself are purged (the meta subject up to the marker only: a record written after it stays).

``guard=False`` skips 3 and 4's fence (a plain delete): only the race test uses it, to show the race it guards.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import structlog
from nats.js import api as jsapi
from nats.js.errors import APIError, NotFoundError

from reel.shared.application import workspace
from reel.shared.application.workspace import MANIFEST_MEDIA_TYPE
from reel.shared.core.errors import ReelError
from reel.shared.core.run import retention
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.fold import fold
from reel.shared.core.run.integrity import decode_log
from reel.shared.core.wire.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER, Names
from reel.shared.nats.archive import purge_run
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.infra import Infra

log = structlog.get_logger(__name__)

DEFAULT_GRACE_S = 3600.0
T = TypeVar("T")


@dataclass
class SweepReport:
    """What one :func:`sweep` did: runs seen, kept as pinned, dropped; blobs seen, deleted, kept by the guard (a
    candidate a commit or a put reached before its delete)."""

    runs: int = 0
    pinned: int = 0
    dropped: list[str] = field(default_factory=list)
    blobs: int = 0
    deleted: int = 0
    saved_by_guard: int = 0


async def pinned(infra: Infra, names: Names) -> set[str]:
    """The run ids in the pin bucket (none if it was never created): the keys with a value (an unpin purges its key),
    read from the bucket's stream info (one request)."""
    prefix = f"$KV.{names.pin_bucket}."
    try:
        info = await infra.js.stream_info(f"KV_{names.pin_bucket}", subjects_filter=prefix + ">")
    except NotFoundError:
        return set()
    return {s[len(prefix):] for s in (info.state.subjects or {})}


async def pin(infra: Infra, names: Names, run_id: str, *, by: str = "") -> None:
    """Pin ``run_id`` (retention never drops it), creating the pin bucket if needed."""
    try:
        kv = await infra.js.key_value(names.pin_bucket)
    except NotFoundError:
        kv = await infra.js.create_key_value(jsapi.KeyValueConfig(
            bucket=names.pin_bucket, history=1, description="Pinned runs: retention keeps them"))
    await kv.put(run_id, json.dumps({"by": by, "at_ms": int(time.time() * 1000)}).encode())


async def unpin(infra: Infra, names: Names, run_id: str) -> None:
    """Unpin ``run_id`` (a run never pinned: nothing happens)."""
    with contextlib.suppress(NotFoundError):
        await infra.js.purge_stream(f"KV_{names.pin_bucket}", subject=f"$KV.{names.pin_bucket}.{run_id}")


async def _last_seq(infra: Infra, stream: str) -> int:
    return (await infra.js.stream_info(stream)).state.last_seq


async def _stream_msgs(infra: Infra, stream: str, subject: str, *, after: int = 0,
                       last_per_subject: bool = False) -> list[tuple[str, int, bytes]]:
    """Every message (subject, seq, body) of ``stream`` on ``subject`` after sequence ``after`` (or the last of each
    subject) up to the stream's last sequence when called (later writes are not chased), read with one ordered
    consumer; empty if the stream does not exist."""
    try:
        info = await infra.js.stream_info(stream)
    except NotFoundError:
        return []
    if info.state.messages == 0 or info.state.last_seq <= after:
        return []
    end = info.state.last_seq
    policy = jsapi.DeliverPolicy.LAST_PER_SUBJECT if last_per_subject else jsapi.DeliverPolicy.BY_START_SEQUENCE
    config = jsapi.ConsumerConfig(deliver_policy=policy, opt_start_seq=None if last_per_subject else after + 1)
    sub = await infra.js.subscribe(subject, stream=stream, ordered_consumer=True, config=config)
    out: list[tuple[str, int, bytes]] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2.0)
            except TimeoutError:
                return out  # nothing (more) on that subject
            md = msg.metadata
            if md.sequence.stream > end:
                return out
            out.append((msg.subject, md.sequence.stream, msg.data))
            if md.num_pending == 0 or md.sequence.stream == end:
                return out
    finally:
        await sub.unsubscribe()


async def _runs_holding(infra: Infra, names: Names) -> dict[str, set[str]]:
    """Which runs have verdicts, a snapshot, outcome markers (from the streams' subjects: one request each)."""
    async def runs(stream: str, prefix: str) -> set[str]:
        info = await infra.js.stream_info(stream, subjects_filter=prefix + ">")
        return {s[len(prefix):].split(".", 1)[0] for s in (info.state.subjects or {})}

    return {"verdicts": await runs(names.verdicts_stream, names.verdict("")),
            "snapshot": await runs(f"KV_{names.snapshot_bucket}", f"$KV.{names.snapshot_bucket}."),
            "outcomes": await runs(f"KV_{names.outcome_bucket}", f"$KV.{names.outcome_bucket}."),
            "pin": set()}  # a dropped run is never pinned


def _mtime_ms(text: str) -> int | None:
    """An object's meta ``mtime`` (RFC 3339, maybe with nanoseconds or ``Z``) in ms; ``None`` if unreadable."""
    if not text:
        return None
    t = text.replace("Z", "+00:00")
    if "." in t:  # at most microseconds for fromisoformat
        head, _, rest = t.partition(".")
        digits = "".join(c for c in rest if c.isdigit())
        tz = rest[len(digits):]
        t = f"{head}.{digits[:6]}{tz}"
    try:
        return int(datetime.fromisoformat(t).timestamp() * 1000)
    except ValueError:
        return None


async def stored_blobs(infra: Infra, names: Names) -> list[tuple[retention.StoredBlob, str]]:
    """Every live object of the blob bucket with the nuid of its chunks."""
    out = []
    prefix = f"$O.{names.blob_bucket}.M."
    for subject, seq, body in await _stream_msgs(infra, f"OBJ_{names.blob_bucket}", prefix + ">",
                                                 last_per_subject=True):
        try:
            info = json.loads(body)
        except ValueError:
            continue
        if not isinstance(info, dict) or info.get("deleted"):
            continue
        mtime = _mtime_ms(str(info.get("mtime", "")))
        if mtime is None:
            continue  # an unreadable age is young
        sha = base64.urlsafe_b64decode(subject[len(prefix):]).decode()
        out.append((retention.StoredBlob(sha256=sha, meta_seq=seq, mtime_ms=mtime), str(info.get("nuid", ""))))
    return out


async def _crucible_refs(infra: Infra, names: Names) -> set[str]:
    """Blobs crucible session logs reference (kept whatever the runs' retention)."""
    stream = f"{names.events_stream.removesuffix('_EVENTS')}_CRUCIBLE"
    refs: set[str] = set()
    for _, _, body in await _stream_msgs(infra, stream, f"{names.namespace}.crucible.>"):
        refs.update(retention.blob_refs(body))
    return refs


async def _workspace_files(infra: Infra, names: Names, manifests: dict[str, BlobRef]) -> set[str]:
    """The file bodies the kept runs' workspace manifests name (docs/workspaces.md): a manifest names them, no event
    does. A manifest that cannot be read marks nothing more (its own blob is marked already)."""
    blobs = JetStreamBlobStore(infra.nc, infra.blobs, names.blob_bucket, purge=False)
    out: set[str] = set()
    for ref in manifests.values():
        try:
            manifest = await workspace.load_manifest(ref, blobs)
        except ReelError as exc:
            log.warning("retention.manifest_unreadable", sha256=ref.sha256, reason=exc.message)
            continue
        out |= {f.sha256 for f in manifest.files.values()}
    return out


async def _kv_refs(infra: Infra, names: Names) -> set[str]:
    """Blobs the snapshot and outcome-marker buckets name: a kept run's snapshot body, and an attempt's output an
    executor recorded before its commit (recovery may commit it later)."""
    refs: set[str] = set()
    for bucket in (names.snapshot_bucket, names.outcome_bucket):
        for _, _, body in await _stream_msgs(infra, f"KV_{bucket}", f"$KV.{bucket}.>", last_per_subject=True):
            refs.update(retention.blob_refs(body))
    return refs


async def sweep(infra: Infra, names: Names, policy: retention.RetentionPolicy, *, now_ms: int,
                grace_s: float = DEFAULT_GRACE_S, collect: bool = True,
                after_mark: Callable[[], Awaitable[None]] | None = None, guard: bool = True) -> SweepReport:
    """Drop the runs ``policy`` lets go at ``now_ms``, then (``collect``) delete the blobs no kept run references.

    ``after_mark`` (tests only) is awaited between the mark and the deletes: a rendezvous for the race test.
    """
    report = SweepReport()
    mark_seq = await _last_seq(infra, names.events_stream)
    pins = await pinned(infra, names)
    summaries: list[retention.RunSummary] = []
    refs_of: dict[str, set[str]] = {}
    by_run: dict[str, list[tuple[int, bytes]]] = {}
    prefix = names.events("")
    for subject, seq, body in await _stream_msgs(infra, names.events_stream, names.events_all):
        by_run.setdefault(subject[len(prefix):], []).append((seq, body))  # one pass over the stream, in order
    manifests_of: dict[str, list[BlobRef]] = {}
    for run_id, raw in by_run.items():
        found = [retention.blob_refs(body) for _, body in raw]
        refs_of[run_id] = set().union(*found)
        manifests_of[run_id] = [r for f in found for r in f.values() if r.media_type == MANIFEST_MEDIA_TYPE]
        commits, bad = decode_log(run_id, raw)
        state = fold(commits) if bad is None else None
        if state is not None:
            summaries.append(retention.RunSummary.of(state))
    report.runs = len(refs_of)
    report.pinned = len(pins & refs_of.keys())
    report.dropped = retention.expired(summaries, policy, now_ms, kept=frozenset(pins))
    if report.dropped:
        held = await _runs_holding(infra, names)
        await _bounded(purge_run(infra, names, run_id, has=frozenset(k for k, runs in held.items() if run_id in runs))
                       for run_id in report.dropped)
    for run_id in report.dropped:
        refs_of.pop(run_id, None)
        manifests_of.pop(run_id, None)
    if not collect:
        return report
    marked: set[str] = set().union(*refs_of.values())
    marked |= await _crucible_refs(infra, names) | await _kv_refs(infra, names)
    marked |= await _workspace_files(infra, names, {r.sha256: r for refs in manifests_of.values() for r in refs})
    blobs = await stored_blobs(infra, names)
    report.blobs = len(blobs)
    nuid_of = {b.sha256: nuid for b, nuid in blobs}
    candidates = retention.collectable([b for b, _ in blobs], marked, now_ms, int(grace_s * 1000))
    if after_mark is not None:
        await after_mark()
    if guard:
        recheck = await _stream_msgs(infra, names.events_stream, names.events_all, after=mark_seq)
        late: set[str] = set().union(*(retention.blob_refs(body) for _, _, body in recheck))
        report.saved_by_guard += sum(1 for c in candidates if c.sha256 in late)
        candidates = [c for c in candidates if c.sha256 not in late]
    for deleted in await _bounded(_delete(infra, names, b, nuid_of[b.sha256], fenced=guard) for b in candidates):
        if deleted:
            report.deleted += 1
        else:
            report.saved_by_guard += 1
    if report.dropped or report.deleted:
        log.info("retention.swept", runs=report.runs, dropped=len(report.dropped), blobs=report.blobs,
                 deleted=report.deleted, saved_by_guard=report.saved_by_guard)
    return report


IN_FLIGHT = 32
"""Purges and deletes one sweep has in flight at once."""


async def _bounded(jobs: Iterable[Awaitable[T]]) -> list[T]:
    """Await ``jobs`` with at most :data:`IN_FLIGHT` at once; their results in order."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(job: Awaitable[T]) -> T:
        async with gate:
            return await job

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def _delete(infra: Infra, names: Names, blob: retention.StoredBlob, nuid: str, *, fenced: bool) -> bool:
    """Delete one object: its delete marker (fenced on the meta record judged, when ``fenced``), its chunks, then the
    marker. False: the record changed since it was judged (a writer touched or rewrote it) — kept."""
    bucket = names.blob_bucket
    meta_subject = f"$O.{bucket}.M.{base64.urlsafe_b64encode(blob.sha256.encode()).decode()}"
    marker = json.dumps({"name": blob.sha256, "bucket": bucket, "nuid": nuid, "size": 0, "chunks": 0,
                         "deleted": True}).encode()
    headers: dict[str, str] = {jsapi.Header.ROLLUP.value: "sub"}
    if fenced:
        headers[EXPECTED_LAST_SUBJECT_SEQ_HEADER] = str(blob.meta_seq)
    try:
        ack = await infra.js.publish(meta_subject, marker, headers=headers)
    except APIError as exc:
        if exc.err_code == 10071:
            return False
        raise
    stream = f"OBJ_{bucket}"
    if nuid:
        await infra.js.purge_stream(stream, subject=f"$O.{bucket}.C.{nuid}")
    await infra.js.purge_stream(stream, subject=meta_subject, seq=ack.seq + 1)  # the marker; a later record stays
    return True


async def serve_loop(infra: Infra, names: Names, policy: retention.RetentionPolicy, stop: asyncio.Event, *,
                     every_s: float, grace_s: float) -> None:
    """:func:`sweep` every ``every_s`` seconds until ``stop`` is set; a failed sweep is logged and tried again."""
    while not stop.is_set():
        try:
            await sweep(infra, names, policy, now_ms=int(time.time() * 1000), grace_s=grace_s)
        except Exception as exc:
            log.warning("retention.sweep_failed", error=repr(exc)[:300])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
