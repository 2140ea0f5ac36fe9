"""The tools of the agent example (fix_typo.yaml): read and write files of the branch's copy of ``project/``.

A workflow that declares ``workspace: {from: project}`` (fix_typo.yaml does) gives each branch its own working
copy, which Reel snapshots after every call and restores on a rewind (docs/workspaces.md): the tools get its folder
as ``workspace=`` (Python) or ``$REEL_WORKSPACE`` (the command). Without one they fall back to a per-run copy:

Every run works in its own copy, ``<tmp>/reel-agent-example/<run id>/`` (``<tmp>`` is
``tempfile.gettempdir()``, i.e. ``$TMPDIR`` or ``/tmp``), made from ``project/`` on the
first call of the run: the shipped files are never touched. The Python tools learn the
run from the ``idempotency_key`` Reel passes them (``<run>/<branch>/<step>``); the
``run_tests`` command (run_tests.py) from ``$REEL_RUN_ID``.

A tool that raises is an error observation for the model (``is_error``), not the end of the run.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent / "project"
"""The shipped project (read only: only ever copied)."""
SCRATCH_ROOT = "reel-agent-example"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def scratch_dir(run_id: str) -> Path:
    """The run's copy of ``project/``, made on first use (atomically: parallel calls see one copy).

    Raises:
        ValueError: ``run_id`` is not a Reel id.
    """
    if not _RUN_ID.match(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    root = Path(tempfile.gettempdir()) / SCRATCH_ROOT
    target = root / run_id
    if not target.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{run_id}-", dir=root))
        shutil.copytree(PROJECT, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        try:
            os.rename(staging, target)
        except OSError:  # another call of this run made it first
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _file(idempotency_key: str, path: str, workspace: str | None = None) -> Path:
    """``path`` inside the branch's workspace (a workflow with ``workspace:``), else the run's scratch copy.

    Raises:
        ValueError: ``path`` points outside it.
    """
    root = (Path(workspace) if workspace else scratch_dir(idempotency_key.split("/", 1)[0])).resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"{path!r} is outside the project")
    return target


def read_file(path: str, idempotency_key: str, workspace: str | None = None) -> str:
    """The text of ``path`` (relative to the project root)."""
    return _file(idempotency_key, path, workspace).read_text()


def write_file(path: str, content: str, idempotency_key: str, workspace: str | None = None) -> str:
    """Replace ``path`` (relative to the project root) with ``content``; says how many bytes it wrote."""
    target = _file(idempotency_key, path, workspace)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return f"wrote {len(content.encode())} bytes to {path}"
