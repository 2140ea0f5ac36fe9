"""Archives of finished runs: write a run's commits, verdicts and every blob they reference to one file, purge it
from the hot streams, and import it back (the file format: docs/operations.md, "Archive file format").

An archive is a POSIX tar (stdlib :mod:`tarfile`) holding:

* ``manifest.json`` — :class:`Manifest`: format name and version, the namespace, when it was written, and per run
  its status, commit count, head LSN and the blobs it references (sha256 → size, media type);
* ``runs/<run_id>/commits.jsonl`` — one :class:`ArchivedMsg` per commit, in LSN order: its LSN and its exact body;
* ``runs/<run_id>/verdicts.jsonl`` — one :class:`ArchivedMsg` per message of the run's verdict subject;
* ``blobs/<sha256>`` — each referenced stored blob's bytes (inline bodies ride in their commits already).

Importing writes the commits in order on the run's subject (fenced like every commit: the first on "no message
yet", each next on the one before), so the run's LSNs are new stream sequences; the LSNs events name (a fork
point, a judged snapshot) are renumbered to them (:mod:`reel.shared.core.run.retention`) and every other byte is
kept. Purging needs the right to purge streams, which only the operator has when auth is on (docs/security.md):
``reel --auth DIR archive …``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tarfile
import tempfile
from pathlib import Path

import msgspec
import structlog
from nats.js.errors import NotFoundError

from reel.shared.core.errors import ReelError, RunNotFound
from reel.shared.core.run import retention
from reel.shared.core.run.events import BlobRef, Verdict, decode_commit, encode_commit
from reel.shared.core.run.fold import fold
from reel.shared.core.run.integrity import decode_log
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.subjects import EXPECTED_LAST_SUBJECT_SEQ_HEADER, MSG_ID_HEADER, Names
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.nats.subjectlog import COMMIT_ID_HEADER

log = structlog.get_logger(__name__)

FORMAT = "reel-archive"
VERSION = 1



class ArchiveRefused(ReelError):
    """A run cannot be archived (live, missing, corrupt) or an archive cannot be imported (bad file, run exists)."""

    code = "archive_refused"


class ArchivedBlob(msgspec.Struct, frozen=True, kw_only=True):
    """One blob in an archive: its size (bytes) and media type; its bytes are ``blobs/<sha256>``."""

    size_bytes: int
    media_type: str = "text/plain"


class ArchivedRun(msgspec.Struct, frozen=True, kw_only=True):
    """One run in an archive's manifest: status and finish time when archived, commit count, head LSN (the
    archived stream's numbering) and the stored blobs its commits reference (sha256 → :class:`ArchivedBlob`)."""

    run_id: str
    status: str
    finished_ms: int | None = None
    commits: int
    head_lsn: int
    verdicts: int = 0
    blobs: dict[str, ArchivedBlob] = {}


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """``manifest.json``: ``format`` is ``reel-archive``, ``version`` 1; ``created_ms``: when it was written (ms)."""

    format: str = FORMAT
    version: int = VERSION
    namespace: str
    created_ms: int
    runs: list[ArchivedRun]


class ArchivedMsg(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``commits.jsonl`` / ``verdicts.jsonl``: the message's stream sequence when archived and its
    body, as UTF-8 text exactly as stored."""

    seq: int
    body: str


async def read_run(elog: JetStreamEventLog, run_id: str) -> tuple[list[tuple[int, bytes]], RunState]:
    """A run's raw commits (LSN, body) and its folded state.

    Raises:
        ArchiveRefused: the run has no commit, or is corrupt.
    """
    raw = await elog.subjects.read_raw(run_id)
    if not raw:
        raise RunNotFound(f"run {run_id} not found (no commits here: never run, or archived already)")
    commits, bad = decode_log(run_id, raw)
    if bad is not None:
        raise ArchiveRefused(f"run {run_id!r} is corrupt at LSN {bad.lsn} ({bad.kind}): not archived")
    state = fold(commits)
    if state is None:  # pragma: no cover - a non-empty good log always folds
        raise ArchiveRefused(f"run {run_id!r} did not fold")
    return raw, state


async def _verdict_msgs(infra: Infra, names: Names, run_id: str) -> list[tuple[int, bytes]]:
    """The messages of the run's verdict subject (seq, body), oldest first."""
    js, seq = infra.js, 0
    out: list[tuple[int, bytes]] = []
    while True:
        try:
            msg = await js.get_msg(names.verdicts_stream, seq=seq + 1, subject=names.verdict(run_id), next=True)
        except NotFoundError:
            return out
        seq = msg.seq or 0
        out.append((seq, msg.data or b""))


async def archive_runs(infra: Infra, names: Names, run_ids: list[str], out: Path, *, now_ms: int,
                       purge: bool = True) -> Manifest:
    """Write ``run_ids`` (finished runs) to the archive ``out``, then (``purge``) drop them from the hot streams.

    The file is written whole (to a temporary file in the same folder, renamed into place) before anything is
    purged, so a failure loses nothing.

    Raises:
        RunNotFound: a run has no commits here (nothing is written or purged).
        ArchiveRefused: a run is live or corrupt (nothing is written or purged).
        BlobMissing / BlobCorrupt: a referenced blob cannot be read (nothing is purged).
    """
    elog = JetStreamEventLog(infra.nc, names)
    blobs = JetStreamBlobStore(infra.nc, infra.blobs, names.blob_bucket, purge=False)
    runs: list[tuple[ArchivedRun, list[tuple[int, bytes]], list[tuple[int, bytes]]]] = []
    for run_id in dict.fromkeys(run_ids):
        raw, state = await read_run(elog, run_id)
        if not retention.RunSummary.of(state).finished:
            raise ArchiveRefused(f"run {run_id!r} is {state.status.value}: only a completed or cancelled run is "
                                 "archived")
        refs: dict[str, BlobRef] = {}
        for _, body in raw:
            refs.update(retention.blob_refs(body))
        verdicts = await _verdict_msgs(infra, names, run_id)
        runs.append((ArchivedRun(run_id=run_id, status=state.status.value, finished_ms=state.finished_ms,
                                 commits=len(raw), head_lsn=raw[-1][0], verdicts=len(verdicts),
                                 blobs={s: ArchivedBlob(size_bytes=r.size_bytes, media_type=r.media_type)
                                        for s, r in sorted(refs.items())}), raw, verdicts))
    manifest = Manifest(namespace=names.namespace, created_ms=now_ms, runs=[r for r, _, _ in runs])
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w") as tar:
            _add(tar, "manifest.json", msgspec.json.encode(manifest))
            written: set[str] = set()
            for run, raw, verdicts in runs:
                _add(tar, f"runs/{run.run_id}/commits.jsonl", _lines(raw))
                _add(tar, f"runs/{run.run_id}/verdicts.jsonl", _lines(verdicts))
                for sha, blob in run.blobs.items():
                    if sha not in written:
                        _add(tar, f"blobs/{sha}", await blobs.get(BlobRef(sha256=sha, size_bytes=blob.size_bytes,
                                                                          media_type=blob.media_type)))
                        written.add(sha)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if purge:
        for run, _, _ in runs:
            await purge_run(infra, names, run.run_id)
    return manifest


async def purge_run(infra: Infra, names: Names, run_id: str, *, has: frozenset[str] | None = None) -> None:
    """Drop a run from the hot streams: its commits, its verdicts, its snapshot, its outcome markers and its pin.
    Its blobs stay until the collector finds no kept run referencing them (:mod:`reel.shared.nats.retention`).

    ``has`` (a sweep that listed the streams' subjects first): which of ``verdicts``, ``snapshot``, ``outcomes``,
    ``pin`` the run has; the others are not purged (``None``: all are)."""
    js = infra.js
    want = has if has is not None else frozenset({"verdicts", "snapshot", "outcomes", "pin"})

    async def pin() -> None:
        with contextlib.suppress(NotFoundError):  # no run was ever pinned here
            await js.purge_stream(f"KV_{names.pin_bucket}", subject=f"$KV.{names.pin_bucket}.{run_id}")

    jobs = [js.purge_stream(names.events_stream, subject=names.events(run_id))]
    if "verdicts" in want:
        jobs.append(js.purge_stream(names.verdicts_stream, subject=names.verdict(run_id)))
    if "snapshot" in want:
        jobs.append(js.purge_stream(f"KV_{names.snapshot_bucket}", subject=f"$KV.{names.snapshot_bucket}.{run_id}"))
    if "outcomes" in want:
        jobs.append(js.purge_stream(f"KV_{names.outcome_bucket}", subject=f"$KV.{names.outcome_bucket}.{run_id}.>"))
    await asyncio.gather(*jobs, *([pin()] if "pin" in want else []))
    log.debug("run.purged", run_id=run_id)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _lines(msgs: list[tuple[int, bytes]]) -> bytes:
    return b"".join(msgspec.json.encode(ArchivedMsg(seq=s, body=b.decode("utf-8"))) + b"\n" for s, b in msgs)


def read_archive(path: Path) -> tuple[Manifest, tarfile.TarFile]:
    """The manifest of the archive at ``path`` and the open tar (the caller closes it).

    Raises:
        ArchiveRefused: not a tar, no manifest, or another format or a newer version.
    """
    try:
        tar = tarfile.open(path, mode="r")  # noqa: SIM115 - returned open, the caller closes it
    except (OSError, tarfile.TarError) as exc:
        raise ArchiveRefused(f"{path} is not a Reel archive: {exc}") from None
    try:
        manifest = msgspec.json.decode(_member(tar, "manifest.json"), type=Manifest)
    except (ArchiveRefused, msgspec.DecodeError, msgspec.ValidationError) as exc:
        tar.close()
        raise ArchiveRefused(f"{path} is not a Reel archive: {exc}") from None
    if manifest.format != FORMAT or manifest.version > VERSION:
        tar.close()
        raise ArchiveRefused(f"{path}: format {manifest.format!r} version {manifest.version} (this Reel reads "
                             f"{FORMAT!r} up to version {VERSION})")
    return manifest, tar


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    try:
        f = tar.extractfile(name)
    except KeyError:
        f = None
    if f is None:
        raise ArchiveRefused(f"the archive has no {name}")
    return f.read()


def _msgs(tar: tarfile.TarFile, name: str) -> list[ArchivedMsg]:
    dec = msgspec.json.Decoder(ArchivedMsg)
    return [dec.decode(line) for line in _member(tar, name).splitlines() if line.strip()]


async def import_archive(infra: Infra, names: Names, path: Path) -> list[tuple[str, int]]:
    """Bring every run of the archive at ``path`` back into the hot streams: blobs first, then the commits in order
    (the LSNs events name renumbered to the new ones), then the verdicts. Returns (run id, new head LSN) per run.

    Raises:
        ArchiveRefused: a bad file, or a run that has commits here already (nothing of that run is written).
    """
    elog = JetStreamEventLog(infra.nc, names)
    blobs = JetStreamBlobStore(infra.nc, infra.blobs, names.blob_bucket, purge=False)
    manifest, tar = read_archive(path)
    done: list[tuple[str, int]] = []
    with tar:
        for run in manifest.runs:
            if await elog.subjects.head_msg(run.run_id) is not None:
                raise ArchiveRefused(f"run {run.run_id!r} exists here already: not imported")
        for run in manifest.runs:
            for sha, blob in run.blobs.items():
                ref = await blobs.put(_member(tar, f"blobs/{sha}"), blob.media_type)
                if ref.sha256 != sha:
                    raise ArchiveRefused(f"blobs/{sha} in {path} holds a body hashing to {ref.sha256}")
            commits = _msgs(tar, f"runs/{run.run_id}/commits.jsonl")
            if len(commits) != run.commits:
                raise ArchiveRefused(f"{path}: run {run.run_id} lists {run.commits} commits, holds {len(commits)}")
            lsn_of: dict[int, int] = {}
            head = 0
            for m in commits:
                body = m.body.encode("utf-8")
                commit = decode_commit(body)
                moved = retention.renumber_commit(commit, lsn_of)
                if moved != commit:
                    body = encode_commit(moved)
                head = await _publish(infra, names.events(run.run_id), body, expected=head,
                                      msg_id=f"import:{manifest.created_ms}:{commit.commit_id}",
                                      commit_id=commit.commit_id)
                lsn_of[m.seq] = head
            elog.note(run.run_id, head)
            for v in _msgs(tar, f"runs/{run.run_id}/verdicts.jsonl"):
                verdict = msgspec.json.decode(v.body.encode("utf-8"), type=Verdict)
                moved_v = retention.renumber_verdict(verdict, lsn_of)
                await infra.js.publish(names.verdict(run.run_id), msgspec.json.encode(moved_v), headers={
                    MSG_ID_HEADER: f"{run.run_id}:{moved_v.snapshot_lsn}:{moved_v.verifier}"})
            log.info("run.imported", run_id=run.run_id, head_lsn=head, commits=len(commits))
            done.append((run.run_id, head))
    return done


async def _publish(infra: Infra, subject: str, body: bytes, *, expected: int, msg_id: str, commit_id: str) -> int:
    ack = await infra.js.publish(subject, body, headers={
        MSG_ID_HEADER: msg_id, EXPECTED_LAST_SUBJECT_SEQ_HEADER: str(expected), COMMIT_ID_HEADER: commit_id})
    return ack.seq
