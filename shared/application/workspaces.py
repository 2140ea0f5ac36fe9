"""The working copies of one process (an executor, a verifier): one folder per run and branch, kept in step with
the log (docs/workspaces.md).

:meth:`WorkingCopies.prepare` makes a branch's folder hold the snapshot the branch is at
(:func:`~reel.shared.core.run.state.workspace_as_of`), materialising it when the folder is missing or holds another
one; :meth:`WorkingCopies.record` snapshots it after a tool call and says whether it changed. The root is
``$REEL_WORKSPACE_ROOT``, else ``<tmp>/reel-workspaces``.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

import structlog

from reel.shared.application import workspace as ws
from reel.shared.core.ports import BlobStore
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.state import RunState, workspace_as_of
from reel.shared.core.workflow.spec import WorkspaceSpec

log = structlog.get_logger("reel.workspace")

ROOT_ENV = "REEL_WORKSPACE_ROOT"


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
        self._held: dict[tuple[str, str], tuple[BlobRef, ws.Manifest]] = {}
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
        folder = ws.working_copy(self.root, *key)
        async with self._lock(key):
            held = self._held.get(key)
            if held is None or held[0].sha256 != expected.sha256 or not folder.is_dir():
                started = time.perf_counter()
                manifest = await ws.materialise(expected, folder, self.blobs)
                self._held[key] = (expected, manifest)
                log.info("workspace.materialised", branch_id=branch_id, manifest=expected.sha256[:12],
                         files=len(manifest.files), ms=round((time.perf_counter() - started) * 1000, 2))
        return folder

    async def record(self, state: RunState, branch_id: str, spec: WorkspaceSpec) -> BlobRef | None:
        """Snapshot ``branch_id``'s working copy; its manifest ref when it changed since the last snapshot
        (``None``: unchanged, or no workspace). Raises WorkspaceTooLarge past the spec's limits."""
        key = (state.run_id, branch_id)
        async with self._lock(key):
            held = self._held.get(key)
            if held is None:
                return None
            started = time.perf_counter()
            snap = await ws.snapshot(ws.working_copy(self.root, *key), spec, self.blobs, held[1])
            log.info("workspace.snapshot", branch_id=branch_id, changed=snap.changed, files=len(snap.manifest.files),
                     stored_bytes=snap.stored_bytes, ms=round((time.perf_counter() - started) * 1000, 2))
            if not snap.changed:
                return None
            self._held[key] = (snap.ref, snap.manifest)
            return snap.ref
