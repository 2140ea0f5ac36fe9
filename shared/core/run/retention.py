"""Retention and archives, the pure part: which finished runs a namespace's policy drops, which blobs no kept run
references, and how an archived run's LSNs are renumbered when it is imported (docs/operations.md, "Retention
and archives").

No clock: ``now_ms`` is an argument. No I/O: the shell (``shared/nats/retention.py``, ``shared/nats/archive.py``)
reads the streams and applies what these functions decide.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from reel.shared.core.run.events import AnyEvent, BlobRef, BranchForked, Commit, RunCompleted, Verdict, VerdictRecorded
from reel.shared.core.run.ids import LSN
from reel.shared.core.run.state import RunState, RunStatus

FINISHED: frozenset[RunStatus] = frozenset({RunStatus.COMPLETED, RunStatus.CANCELLED})
"""The statuses a run may be archived or dropped in; every other status is live (a rewind may reopen a completed
run, which is then live again until it finishes)."""

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """A namespace's retention: keep finished runs ``keep_days`` days (since they finished) and/or the newest
    ``keep_newest`` finished runs (by finish time); ``None``: that limit is off. A run is dropped only when every
    limit that is on lets it go; with both off nothing is dropped. Live, pinned and referenced runs are kept."""

    keep_days: float | None = None
    keep_newest: int | None = None

    @property
    def on(self) -> bool:
        """Whether any limit is set."""
        return self.keep_days is not None or self.keep_newest is not None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What retention needs of one run: its status and finish time (ms since the epoch; ``None`` while live)."""

    run_id: str
    status: RunStatus
    finished_ms: int | None

    @classmethod
    def of(cls, state: RunState) -> RunSummary:
        """The summary of a folded run."""
        return cls(state.run_id, state.status, state.finished_ms)

    @property
    def finished(self) -> bool:
        """Whether the run is completed or cancelled."""
        return self.status in FINISHED


def expired(runs: Iterable[RunSummary], policy: RetentionPolicy, now_ms: int, *,
            kept: frozenset[str] = frozenset()) -> list[str]:
    """The run ids ``policy`` drops at ``now_ms``, oldest finish first: finished runs not in ``kept`` (pinned or
    referenced) that are older than ``keep_days`` and not among the ``keep_newest`` newest finished runs.

    Kept runs count towards ``keep_newest`` (a pinned run is one of the newest N if it is that new)."""
    if not policy.on:
        return []
    done = sorted((r for r in runs if r.finished), key=lambda r: (-(r.finished_ms or 0), r.run_id))
    out: list[str] = []
    for rank, r in enumerate(done):
        if r.run_id in kept:
            continue
        if policy.keep_newest is not None and rank < policy.keep_newest:
            continue
        if policy.keep_days is not None and (r.finished_ms or 0) > now_ms - policy.keep_days * DAY_MS:
            continue
        out.append(r.run_id)
    return out[::-1]


def blob_refs(body: bytes) -> dict[str, BlobRef]:
    """Every stored (not inline) blob a JSON document references, by sha256: any object with a string ``sha256``,
    an integer ``size_bytes`` and no ``inline`` (a :class:`~reel.shared.core.run.eventfields.BlobRef` wherever it
    sits — a commit's events, a crucible session's record). A body that is not JSON references nothing."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {}
    found: dict[str, BlobRef] = {}
    stack: list[object] = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            sha, size = node.get("sha256"), node.get("size_bytes")
            if isinstance(sha, str) and isinstance(size, int) and "inline" not in node:
                media = node.get("media_type")
                found[sha] = BlobRef(sha256=sha, size_bytes=size,
                                     media_type=media if isinstance(media, str) else "text/plain")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """One live object of the blob store as the collector saw it: its name (sha256), its meta record's stream
    sequence (what a delete is fenced on) and its meta record's mtime (ms since the epoch: when it was last
    written or touched)."""

    sha256: str
    meta_seq: int
    mtime_ms: int


def collectable(blobs: Iterable[StoredBlob], referenced: Container[str], now_ms: int,
                grace_ms: int) -> list[StoredBlob]:
    """The blobs no kept run references whose meta record is older than ``grace_ms``.

    The grace covers a writer between its blob put (which touches an existing object: a fresh mtime) and the commit
    naming it; the delete itself is fenced on ``meta_seq`` so a touch after this decision keeps the blob."""
    return [b for b in blobs if b.sha256 not in referenced and b.mtime_ms < now_ms - grace_ms]


def renumber_event(event: AnyEvent, lsn_of: Mapping[int, int]) -> AnyEvent:
    """``event`` with every LSN it names (a fork point, a judged snapshot) moved to the imported run's LSNs.

    ``lsn_of`` maps each earlier commit's archived LSN to its new one; a fork point between commits maps to the new
    LSN of the last commit at or below it (the fork inherits exactly the same commits).

    Raises:
        ValueError: the event names an LSN below the run's first commit.
    """
    if isinstance(event, BranchForked):
        return msgspec.structs.replace(event, fork_lsn=LSN(_at_or_below(event.fork_lsn, lsn_of)))
    if isinstance(event, RunCompleted) and event.snapshot_lsn:
        return msgspec.structs.replace(event, snapshot_lsn=LSN(_at_or_below(event.snapshot_lsn, lsn_of)))
    if isinstance(event, VerdictRecorded):
        return msgspec.structs.replace(event, verdict=renumber_verdict(event.verdict, lsn_of))
    return event


def renumber_verdict(verdict: Verdict, lsn_of: Mapping[int, int]) -> Verdict:
    """``verdict`` judged at the imported run's LSN of its snapshot (:func:`renumber_event`)."""
    return msgspec.structs.replace(verdict, snapshot_lsn=LSN(_at_or_below(verdict.snapshot_lsn, lsn_of)))


def renumber_commit(commit: Commit, lsn_of: Mapping[int, int]) -> Commit:
    """:func:`renumber_event` over one commit's events (the commit id, writer and run id are kept)."""
    return msgspec.structs.replace(commit, events=tuple(renumber_event(e, lsn_of) for e in commit.events))


def _at_or_below(lsn: int, lsn_of: Mapping[int, int]) -> int:
    below = [old for old in lsn_of if old <= lsn]
    if not below:
        raise ValueError(f"LSN {lsn} is below the run's first archived commit")
    return lsn_of[max(below)]


def lsn_map(old: Sequence[int], new: Sequence[int]) -> dict[int, int]:
    """The archived → imported LSN of each commit, in order (both ascending, one per commit)."""
    if len(old) != len(new):
        raise ValueError(f"{len(old)} archived commits but {len(new)} imported")
    return dict(zip(old, new, strict=True))
