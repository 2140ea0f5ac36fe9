"""The pure core starts no process and signals none.

import-linter (pyproject ``[tool.importlinter]``) forbids importing ``subprocess``
into ``reel.shared.core`` and ``reel.shared.crucible``, but it cannot see
``asyncio.create_subprocess_exec`` or ``os.fork``: this scans their sources.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).parents[2] / "shared"
PURE = ("core", "crucible")
FORBIDDEN = ("create_subprocess", "subprocess", "os.fork", "os.kill", "os.system", "os.popen", "os.spawn",
             "os.exec", "os.posix_spawn")


def _sources() -> list[Path]:
    return sorted(p for pkg in PURE for p in (SHARED / pkg).rglob("*.py"))


def test_the_scan_sees_the_core() -> None:
    names = {p.relative_to(SHARED).as_posix() for p in _sources()}
    assert {"core/run/fold.py", "core/verify/verifiers/context.py", "crucible/iteration.py"} <= names


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.relative_to(SHARED).as_posix())
def test_no_process_code_in_the_core(path: Path) -> None:
    text = path.read_text()
    hits = [(n, word) for n, line in enumerate(text.splitlines(), 1) for word in FORBIDDEN if word in line]
    assert hits == [], f"{path.relative_to(SHARED)} runs or signals processes (belongs in shared/proc/): {hits}"
