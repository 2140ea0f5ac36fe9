"""The side-effect ledger (shared/proc/ledger.py): off by default; when this process's environment names it,
``run_group`` records every process it starts for an attempt, with its pid, and the process never sees the path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reel.shared.proc import ledger
from reel.shared.proc.group import run_group

ATTEMPT = {"REEL_RUN_ID": "r-1", "REEL_BRANCH_ID": "main", "REEL_STEP_ID": "fix:t1:c0", "REEL_ATTEMPT": "2",
           "REEL_TOOL_NAME": "poke"}
SHOW_ENV = ["sh", "-c", f'echo "${{{ledger.LEDGER_ENV}:-unset}}"']


async def test_a_started_tool_process_is_recorded_and_never_sees_the_ledger(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    done = await run_group(SHOW_ENV, timeout_s=30, env={**os.environ, **ATTEMPT})
    assert done.stdout.decode().strip() == "unset"  # removed from the child's environment
    verifier = await run_group(SHOW_ENV, timeout_s=30)  # no attempt named (a verifier's command): not recorded
    assert verifier.stdout.decode().strip() == "unset"
    [entry] = ledger.read(path)
    assert (entry.kind, entry.run_id, entry.branch_id, entry.step_id, entry.attempt, entry.tool) == (
        "process", "r-1", "main", "fix:t1:c0", 2, "poke")
    assert entry.pid > 0


async def test_off_unless_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ledger.LEDGER_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    await run_group(["true"], timeout_s=30, env={**os.environ, **ATTEMPT})
    assert not ledger.enabled() and os.listdir(tmp_path) == []
    assert ledger.read(tmp_path / "missing.jsonl") == []
