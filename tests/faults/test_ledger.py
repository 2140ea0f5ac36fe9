"""The ledger's summary line (the one the fault suite prints at the end of a session)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.faults.conftest import FaultsLedger

pytestmark = pytest.mark.faults


def test_line_sums_every_scenario_and_a_second_record_replaces_the_first() -> None:
    ledger = FaultsLedger()
    ledger.record("a", runs=3, lost=0, stuck=1, unrecorded=0)
    ledger.record("b", runs=10, lost=2, stuck=0, unrecorded=5)
    ledger.record("a", runs=4, lost=1, stuck=0, unrecorded=0)
    assert ledger.line() == "faults: 2 scenarios, 14 runs, 3 lost, 0 stuck, 5 unrecorded side effects"


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="negative count"):
        FaultsLedger().record("a", runs=1, lost=-1, stuck=0, unrecorded=0)


def test_the_summary_hook_prints_the_line_under_q(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.faults.conftest import faults_ledger, pytest_terminal_summary\n")
    (tmp_path / "test_one.py").write_text("def test_x(faults_ledger):\n"
                                          "    faults_ledger.record('s', runs=2, lost=0, stuck=0, unrecorded=0)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "faults: 1 scenarios, 2 runs, 0 lost, 0 stuck, 0 unrecorded side effects" in lines, out.stdout


def test_no_line_when_nothing_recorded(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.faults.conftest import faults_ledger, pytest_terminal_summary\n")
    (tmp_path / "test_one.py").write_text("def test_x(faults_ledger):\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not [ln for ln in out.stdout.splitlines() if ln.startswith("faults:")], out.stdout
