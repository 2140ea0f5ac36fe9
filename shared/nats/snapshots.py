"""Snapshots of a run's folded state, so a read need not replay the whole log.

A snapshot is the :class:`~reel.shared.core.run.state.RunState` of one run at one LSN, as JSON
in the KV bucket ``<ns>_snapshots`` (key = run id, the latest snapshot only) —
inline when small, else in the blob store with the KV entry pointing at it. The executor writes one when a run
enters ``Verifying`` — the LSN every verifier of that run pins — so a verifier
reads the snapshot plus the commits above it instead of the whole run, whose
commits may be spread thinly over a busy stream.

A snapshot is only a shortcut, never a source of truth:

* it carries the commit id of the commit at its LSN; a reader re-reads the log
  *from* that LSN and uses the snapshot only if that commit is there with that id;
* it carries :data:`reel.shared.core.run.fold.FOLD_VERSION`; one written by another fold is ignored;
* anything wrong (missing blob, undecodable, mismatch) falls back to a cold fold.

Tests check that a snapshot-based load equals a cold re-fold byte for byte.
"""

from __future__ import annotations

import msgspec
import structlog
from nats.aio.client import Client
from nats.js.errors import BadRequestError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from reel.shared.core.errors import ReelError
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.fold import FOLD_VERSION
from reel.shared.core.run.state import RunState
from reel.shared.core.run.statecodec import STATE_ENCODER, state_decoder
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.blobstore import JetStreamBlobStore

log = structlog.get_logger(__name__)


class SnapshotRef(msgspec.Struct, frozen=True, kw_only=True):
    """The KV entry of a run's latest snapshot.

    Attributes:
        lsn: the LSN the state was folded up to (its ``head_lsn``).
        commit_id: the id of the commit at ``lsn`` (checked against the log on read).
        state: the RunState itself when its JSON is at most :data:`INLINE_MAX_BYTES`, else
        state_ref: the blob holding the JSON-encoded RunState.
        fold_version: :data:`reel.shared.core.run.fold.FOLD_VERSION` of the writer.
    """

    run_id: str
    lsn: int
    commit_id: str
    state: RunState | None = None
    state_ref: BlobRef | None = None
    fold_version: int


INLINE_MAX_BYTES = 256 * 1024
_state_decoder = state_decoder(RunState)
_ref_decoder = state_decoder(SnapshotRef)
_enc = STATE_ENCODER
class SnapshotStore:
    """Read and write run snapshots (KV pointer + blob body)."""

    def __init__(self, kv: KeyValue, blobs: JetStreamBlobStore) -> None:
        self.kv, self.blobs = kv, blobs

    @classmethod
    async def open(cls, nc: Client, names: Names) -> SnapshotStore | None:
        """The store of ``names``, or ``None`` if its bucket does not exist (no snapshots then)."""
        js = nc.jetstream()
        try:
            kv = await js.key_value(names.snapshot_bucket)
            obs = await js.object_store(names.blob_bucket)
        except (NotFoundError, BadRequestError):
            return None
        return cls(kv, JetStreamBlobStore(nc, obs, names.blob_bucket))

    async def save(self, state: RunState, commit_id: str) -> SnapshotRef:
        """Store ``state`` (folded up to ``state.head_lsn``, whose commit has ``commit_id``).

        Small states go inline in the KV entry (one read); larger ones to the blob store.
        """
        body = _enc.encode(state)
        ref = SnapshotRef(run_id=state.run_id, lsn=state.head_lsn, commit_id=commit_id, fold_version=FOLD_VERSION)
        if len(body) <= INLINE_MAX_BYTES:
            ref = msgspec.structs.replace(ref, state=state)
        else:
            ref = msgspec.structs.replace(ref, state_ref=await self.blobs.put(body, "application/json"))
        await self.kv.put(state.run_id, _enc.encode(ref))
        return ref

    async def latest(self, run_id: str) -> SnapshotRef | None:
        """The run's latest usable snapshot pointer (same fold version), or ``None``."""
        try:
            entry = await self.kv.get(run_id)
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        try:
            ref = _ref_decoder.decode(entry.value)
        except msgspec.MsgspecError:
            log.warning("snapshot.undecodable", run_id=run_id)
            return None
        return ref if ref.fold_version == FOLD_VERSION and ref.run_id == run_id else None

    async def state(self, ref: SnapshotRef) -> RunState | None:
        """The snapshot's state, or ``None`` if its body is missing or undecodable."""
        if ref.state is not None:
            return ref.state
        if ref.state_ref is None:
            return None
        try:
            return _state_decoder.decode(await self.blobs.get(ref.state_ref))
        except (ReelError, msgspec.MsgspecError) as exc:
            log.warning("snapshot.unreadable", run_id=ref.run_id, lsn=ref.lsn, error=str(exc))
            return None
