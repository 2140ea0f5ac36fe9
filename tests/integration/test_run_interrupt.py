"""Ctrl-C during ``reel run``, as a real process against the test server: the line it prints says what happens
to the run — it goes on under services that run elsewhere, or it waits for an executor when the one that drove
it was this command's own: that one stops the attempt in flight (its tool killed) and records it
``interrupted`` before it goes. Exit 130 either way; the run is never lost."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from reel.shared.nats.client import ReelClient
from reel.shared.runtime.config import Config
from tests.integration.test_cli import REPO
from tests.support.sigint import as_at_a_terminal


def slow(seconds: int, done: Path) -> str:
    """A workflow of one command that sleeps ``seconds`` s, then writes ``done``."""
    return f"""name: slow
steps:
  - kind: tool
    id: nap
    tool: {{type: command, argv: ["sh", "-c", "sleep {seconds}; touch {done}"]}}
"""


async def _interrupted_run(cfg: Config, workflow: Path) -> tuple[int, str, str]:
    """``reel run WORKFLOW``, SIGINT once it printed that the attempt was dispatched: (exit code, run id,
    stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", "run", str(workflow), "--nats-url", cfg.nats_url,
        "--namespace", cfg.names.namespace, cwd=REPO, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"}, preexec_fn=as_at_a_terminal)
    assert proc.stdout is not None and proc.stderr is not None
    run_id = ""
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line, "reel run ended before the attempt was dispatched"
        if " created" in line and line.startswith("run "):
            run_id = line.split()[1]
        if "nap#1 dispatched" in line:
            break
    proc.send_signal(signal.SIGINT)
    err = (await asyncio.wait_for(proc.stderr.read(), 60)).decode()
    return await asyncio.wait_for(proc.wait(), 60), run_id, err


@pytest.mark.usefixtures("executor")
async def test_interrupted_with_services_running_elsewhere_the_run_goes_on(
        client: ReelClient, cfg: Config, tmp_path: Path) -> None:
    (tmp_path / "slow.yaml").write_text(slow(5, tmp_path / "done"))  # still running when Ctrl-C lands
    code, run_id, err = await _interrupted_run(cfg, tmp_path / "slow.yaml")
    assert code == 130
    assert f"interrupted: run {run_id} goes on under the running services" in " ".join(err.split()), err
    state = await client.wait_for(run_id, ("verifying", "completed"), timeout_s=60)  # the executor elsewhere ran it
    assert state.branches["main"].attempts["nap"][-1].status == "succeeded"


async def test_interrupted_with_its_own_executor_the_run_waits_for_one(
        client: ReelClient, cfg: Config, tmp_path: Path) -> None:
    (tmp_path / "slow.yaml").write_text(slow(60, tmp_path / "done"))
    code, run_id, err = await _interrupted_run(cfg, tmp_path / "slow.yaml")
    assert code == 130
    assert f"interrupted: run {run_id} is left as it is and resumes when an executor runs" in " ".join(
        err.split()), err
    state = await client.log.load(run_id)
    assert state.status == "running"  # kept in the log, for the next executor
    (nap,) = state.branches["main"].attempts["nap"]
    assert (nap.status, nap.error_kind) == ("failed", "interrupted"), nap  # recorded, not left open to recovery
    assert not (tmp_path / "done").exists(), "the tool was killed"
