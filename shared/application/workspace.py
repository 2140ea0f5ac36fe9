"""Workspaces (docs/workspaces.md): snapshot a branch's working copy into the blob store, materialise one, diff two;
and :class:`WorkingCopies`, the working copies of one process (an executor, a verifier), kept in step with the log.

A snapshot is a *manifest* — canonical JSON ``{"v": 1, "files": {path: {sha256, size_bytes, mode}}}``, paths
relative and ``/``-separated, sorted — stored as a blob of media type :data:`MANIFEST_MEDIA_TYPE`; each file's
body is a blob of its own, named by its sha256. Snapshots are incremental: a file whose digest the previous
manifest already names is not written again (nor is one the store holds already). The manifest's
:class:`~reel.shared.core.run.events.BlobRef` is the snapshot id an outcome commit records.
"""

from __future__ import annotations

import asyncio
import difflib
import fnmatch
import hashlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec
import structlog

from reel.shared.core.errors import ReelError
from reel.shared.core.ports import BlobStore
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.ids import BranchId
from reel.shared.core.run.state import RunState, workspace_as_of
from reel.shared.core.workflow.spec import WorkspaceSpec

log = structlog.get_logger("reel.workspace")


class BlobGetter(Protocol):
    """What reading a snapshot needs of a blob store (a verifier's reader has just this)."""

    async def get(self, ref: BlobRef) -> bytes:
        """The whole body of ``ref`` (bytes).

        Raises:
            BlobMissing, BlobCorrupt, BlobTimeout: the body is gone, does not match its sha256, or was not read
                in time.
        """
        ...


MANIFEST_MEDIA_TYPE = "application/vnd.reel.workspace+json"
FILE_MEDIA_TYPE = "application/octet-stream"
DIFF_TEXT_MAX_BYTES = 64 * 1024
"""A changed file is shown as a unified diff when both its versions are UTF-8 text of at most this many bytes."""


class WorkspaceTooLarge(ReelError):
    """The workspace holds more bytes or files than its ``max_bytes`` / ``max_files``."""

    code = "workspace_too_large"


class FileEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a manifest: its body's digest and size (bytes), and whether it is executable."""

    sha256: str
    size_bytes: int
    executable: bool = False

    @property
    def ref(self) -> BlobRef:
        """The file body's blob."""
        return BlobRef(sha256=self.sha256, size_bytes=self.size_bytes, media_type=FILE_MEDIA_TYPE)


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """A workspace snapshot: relative path → :class:`FileEntry`."""

    v: int = 1
    files: dict[str, FileEntry] = {}

    @property
    def size_bytes(self) -> int:
        """Bytes of all its files."""
        return sum(f.size_bytes for f in self.files.values())


_enc = msgspec.json.Encoder(order="sorted")
_dec = msgspec.json.Decoder(Manifest)


def encode_manifest(manifest: Manifest) -> bytes:
    """Canonical bytes (sorted keys): equal workspaces give equal bytes, hence one blob."""
    return _enc.encode(manifest)


def _ignored(rel: str, patterns: Iterable[str]) -> bool:
    parts = rel.split("/")
    return any(fnmatch.fnmatchcase(rel, p) or any(fnmatch.fnmatchcase(part, p) for part in parts) for p in patterns)


def _files(root: Path, spec: WorkspaceSpec) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        dirnames[:] = sorted(d for d in dirnames
                             if not _ignored(d if rel_dir == "." else f"{rel_dir}/{d}", spec.ignore))
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if not _ignored(rel, spec.ignore) and (base / name).is_file():
                out.append((rel, base / name))
    return out


@dataclass
class Scan:
    """A folder read for a snapshot: its manifest and the bodies the previous manifest lacks."""

    manifest: Manifest
    new_bodies: dict[str, Path]


def scan(root: Path, spec: WorkspaceSpec, previous: Manifest | None = None) -> Scan:
    """Read ``root`` into a manifest (digesting each file), checking the limits.

    Raises:
        WorkspaceTooLarge: more than ``spec.max_files`` files or ``spec.max_bytes`` bytes.
    """
    files = _files(root, spec)
    if len(files) > spec.max_files:
        raise WorkspaceTooLarge(f"workspace {root} holds {len(files)} files, over its max_files of {spec.max_files}"
                                " (raise `workspace.max_files` or add `ignore` patterns)")
    known = {f.sha256 for f in previous.files.values()} if previous else set()
    entries: dict[str, FileEntry] = {}
    new: dict[str, Path] = {}
    total = 0
    for rel, path in files:
        st = path.stat()
        total += st.st_size
        if total > spec.max_bytes:
            raise WorkspaceTooLarge(f"workspace {root} holds over {spec.max_bytes} bytes (its max_bytes) in "
                                    f"{len(files)} files (raise `workspace.max_bytes` or add `ignore` patterns)")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        entries[rel] = FileEntry(sha256=digest, size_bytes=st.st_size, executable=bool(st.st_mode & stat.S_IXUSR))
        if digest not in known:
            new.setdefault(digest, path)
    return Scan(Manifest(files=dict(sorted(entries.items()))), new)


@dataclass(frozen=True)
class Snapshot:
    """A stored snapshot: its manifest ref, and the bytes this snapshot wrote (new file bodies + the manifest)."""

    ref: BlobRef
    manifest: Manifest
    stored_bytes: int
    changed: bool


async def snapshot(root: Path, spec: WorkspaceSpec, blobs: BlobStore, previous: Manifest | None = None) -> Snapshot:
    """Snapshot ``root``: store the file bodies ``previous`` does not name, then the manifest.

    ``changed`` is False when the manifest equals ``previous`` (nothing is written then).

    Raises:
        WorkspaceTooLarge: see :func:`scan`.
    """
    read = await asyncio.to_thread(scan, root, spec, previous)
    body = encode_manifest(read.manifest)
    ref = BlobRef(sha256=hashlib.sha256(body).hexdigest(), size_bytes=len(body), media_type=MANIFEST_MEDIA_TYPE)
    if previous is not None and read.manifest == previous:
        return Snapshot(ref, read.manifest, 0, False)
    stored = 0
    for path in read.new_bodies.values():
        data = await asyncio.to_thread(path.read_bytes)
        await blobs.put(data, FILE_MEDIA_TYPE)
        stored += len(data)
    await blobs.put(body, MANIFEST_MEDIA_TYPE)
    return Snapshot(ref, read.manifest, stored + len(body), True)


async def load_manifest(ref: BlobRef, blobs: BlobGetter) -> Manifest:
    """The manifest ``ref`` names. Raises BlobMissing when it is not stored."""
    return _dec.decode(await blobs.get(ref))


async def materialise(ref: BlobRef, into: Path, blobs: BlobGetter) -> Manifest:
    """Make ``into`` hold exactly the snapshot ``ref`` (written beside it, then swapped in); its manifest.

    Raises:
        BlobMissing: the manifest or a file body is not stored.
    """
    manifest = await load_manifest(ref, blobs)
    bodies = {e.sha256: await blobs.get(e.ref) for e in manifest.files.values()}
    await asyncio.to_thread(_write_tree, manifest, bodies, into)
    return manifest


def _write_tree(manifest: Manifest, bodies: dict[str, bytes], into: Path) -> None:
    into.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{into.name}-", dir=into.parent))
    try:
        for rel, entry in manifest.files.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(bodies[entry.sha256])
            if entry.executable:
                target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        if into.exists():
            shutil.rmtree(into)
        os.rename(staging, into)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def working_copy(root: Path, run_id: str, branch_id: str) -> Path:
    """The folder of ``branch_id``'s working copy of run ``run_id`` under ``root``."""
    return root / run_id / branch_id


ROOT_ENV = "REEL_WORKSPACE_ROOT"
"""The variable naming the folder working copies live under (default ``<tmp>/reel-workspaces``)."""


def default_root() -> Path:
    """``$REEL_WORKSPACE_ROOT``, else ``<tmp>/reel-workspaces``."""
    return Path(os.environ.get(ROOT_ENV) or Path(tempfile.gettempdir()) / "reel-workspaces")


def seed_dir(spec: WorkspaceSpec, source_dir: str | None) -> Path:
    """The folder a workspace starts as: ``from:`` relative to the workflow file's folder (else the cwd)."""
    return Path(source_dir or ".") / spec.source


class WorkingCopies:
    """Working copies under ``root``, and the snapshot each one holds as far as this process knows."""

    def __init__(self, blobs: BlobStore, root: Path | None = None) -> None:
        self.blobs, self.root = blobs, root or default_root()
        self._held: dict[tuple[str, str], tuple[BlobRef, Manifest]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def prepare(self, state: RunState, branch_id: str) -> Path | None:
        """The folder of ``branch_id``'s working copy holding the branch's snapshot (``None``: the run has no
        workspace). Raises BlobMissing when the snapshot is not stored."""
        expected = workspace_as_of(state, branch_id)  # type: ignore[arg-type]
        if expected is None:
            return None
        key = (state.run_id, branch_id)
        folder = working_copy(self.root, *key)
        async with self._lock(key):
            held = self._held.get(key)
            if held is None or held[0].sha256 != expected.sha256 or not folder.is_dir():
                started = time.perf_counter()
                manifest = await materialise(expected, folder, self.blobs)
                self._held[key] = (expected, manifest)
                log.info("workspace.materialised", branch_id=branch_id, manifest=expected.sha256[:12],
                         files=len(manifest.files), ms=round((time.perf_counter() - started) * 1000, 2))
        return folder

    async def forget(self, run_id: str) -> None:
        """Drop what this process holds of the run's working copies (a run that no longer runs here: verifying,
        completed or cancelled), so a long-lived executor's memory does not grow with every run it drove. The
        folders stay for the user to look at (docs/workspaces.md); a branch that runs here again (a rewind, a
        resume) is materialised anew by :meth:`prepare`."""
        for key in [k for k in self._held if k[0] == run_id]:
            async with self._lock(key):
                self._held.pop(key, None)
            self._locks.pop(key, None)

    async def record(self, state: RunState, branch_id: str, spec: WorkspaceSpec) -> BlobRef | None:
        """Snapshot ``branch_id``'s working copy; its manifest ref when it changed since the last snapshot
        (``None``: unchanged, or no workspace). Raises WorkspaceTooLarge past the spec's limits."""
        key = (state.run_id, branch_id)
        async with self._lock(key):
            held = self._held.get(key)
            if held is None:
                return None
            started = time.perf_counter()
            snap = await snapshot(working_copy(self.root, *key), spec, self.blobs, held[1])
            log.info("workspace.snapshot", branch_id=branch_id, changed=snap.changed, files=len(snap.manifest.files),
                     stored_bytes=snap.stored_bytes, ms=round((time.perf_counter() - started) * 1000, 2))
            if not snap.changed:
                return None
            self._held[key] = (snap.ref, snap.manifest)
            return snap.ref


@dataclass(frozen=True)
class FileChange:
    """One path a snapshot changed: ``added``, ``removed`` or ``modified``; ``diff``: a unified diff when small
    text (else ``None``)."""

    path: str
    change: str
    diff: str | None = None


def changed_paths(old: Manifest | None, new: Manifest) -> list[tuple[str, str]]:
    """``(path, added|removed|modified)`` for each path whose body differs, sorted by path."""
    before = old.files if old is not None else {}
    out = [(p, "added") for p in new.files if p not in before]
    out += [(p, "removed") for p in before if p not in new.files]
    out += [(p, "modified") for p, f in new.files.items() if p in before and before[p].sha256 != f.sha256]
    return sorted(out)


async def diff(old: Manifest | None, new: Manifest, blobs: BlobGetter) -> list[FileChange]:
    """The changes from ``old`` to ``new``, each with a unified diff when both sides are small UTF-8 text."""
    out: list[FileChange] = []
    for path, change in changed_paths(old, new):
        a = old.files.get(path) if old is not None else None
        b = new.files.get(path)
        sides = [e for e in (a, b) if e is not None]
        text: str | None = None
        if all(e.size_bytes <= DIFF_TEXT_MAX_BYTES for e in sides):
            try:
                lines = [(await blobs.get(e.ref)).decode() if e else "" for e in (a, b)]
                text = "".join(difflib.unified_diff(lines[0].splitlines(keepends=True),
                                                    lines[1].splitlines(keepends=True),
                                                    fromfile=f"a/{path}", tofile=f"b/{path}"))
            except UnicodeDecodeError:
                text = None
        out.append(FileChange(path, change, text))
    return out


@dataclass(frozen=True)
class CallSnapshot:
    """A tool call (one attempt) that changed its branch's workspace: the snapshot before it (``None``: none) and
    the one its outcome commit at ``lsn`` recorded."""

    lsn: int
    step_id: str
    attempt: int
    before: BlobRef | None
    after: BlobRef


def call_snapshots(state: RunState, branch_id: BranchId) -> list[CallSnapshot]:
    """Each attempt of ``branch_id`` whose outcome recorded a workspace snapshot, in LSN order (pure)."""
    calls = sorted((a.outcome_lsn, a.step_id, a.attempt, a.workspace)
                   for attempts in state.branches[branch_id].attempts.values() for a in attempts
                   if isinstance(a.workspace, BlobRef) and a.outcome_lsn is not None)
    return [CallSnapshot(lsn, step_id, n, workspace_as_of(state, branch_id, lsn - 1), ref)
            for lsn, step_id, n, ref in calls]


async def call_diff(call: CallSnapshot, blobs: BlobGetter) -> list[FileChange]:
    """What ``call`` changed in its workspace (:func:`diff` of its snapshot against the one before it).

    Raises:
        BlobMissing: a manifest or body is gone.
    """
    old = await load_manifest(call.before, blobs) if call.before is not None else None
    return await diff(old, await load_manifest(call.after, blobs), blobs)


async def branch_diffs(state: RunState, branches: Sequence[BranchId], blobs: BlobGetter | None
                       ) -> dict[BranchId, str] | None:
    """Each of ``branches[1:]``'s workspace at its head against the baseline's (``branches[0]``): a line per
    changed path (``added|removed|modified PATH``), each followed by its unified diff when small text; ``""``:
    the same files. ``None`` for a run that keeps no workspace, or with no blob store.

    Raises:
        KeyError: a branch the run does not have. BlobMissing: a manifest or body is gone.
    """
    if blobs is None or not isinstance(state.workspace, BlobRef) or not branches:
        return None
    base_ref = workspace_as_of(state, branches[0])
    base = await load_manifest(base_ref, blobs) if base_ref is not None else None
    out: dict[BranchId, str] = {}
    for b in branches[1:]:
        ref = workspace_as_of(state, b)
        if ref is None:
            continue
        lines = []
        for change in await diff(base, await load_manifest(ref, blobs), blobs):
            lines.append(f"{change.change} {change.path}")
            if change.diff:
                lines.append(change.diff.rstrip("\n"))
        out[b] = "\n".join(lines)
    return out
