"""The `reel` command line, run as a real process against the test server (as a user would)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

from reel.shared.core.run.events import RunCancelled
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config

REPO = Path(__file__).resolve().parents[2]


async def reel(cfg: Config, *args: str, timeout_s: float = 120) -> tuple[int, str, str]:
    """Run ``reel ARGS --nats-url … --namespace …``; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", *args,
        "--nats-url", cfg.nats_url, "--namespace", cfg.names.namespace,
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_run_show_rewind_cancel_from_the_command_line(cfg: Config, event_log: JetStreamEventLog) -> None:
    code, out, err = await reel(cfg, "run", "examples/hello.yaml", "-q")
    assert code == 0, (out, err)
    match = re.search(r"run (r-[0-9a-f]{20})", out)
    assert match, out
    run_id = match.group(1)
    assert "completed" in out and "outcome passed" in out

    code, out, err = await reel(cfg, "show", run_id)
    assert code == 0, err
    for step in ("plan", "run", "summarize"):
        assert step in out
    assert "packed" in out and "dropped" in out and "rate_limited" in out  # the failed attempt is shown

    code, out, err = await reel(cfg, "rewind", run_id, "--at-step", "summarize", "--key", "k1")
    assert code == 0, err
    said = out.strip().splitlines()[-1]
    assert said.startswith(f"run {run_id} rewound from step summarize: branch b-"), out
    code, out, err = await reel(cfg, "rewind", run_id, "--at-step", "summarize", "--key", "k1", "--json")
    assert code == 0, err
    reply = json.loads(out.strip().splitlines()[-1])
    assert reply["branch_id"] in said  # the same key: the same branch
    assert reply["ok"] and reply["branch_id"]
    state = await event_log.load(run_id)
    assert reply["branch_id"] in state.branches
    assert state.branches[reply["branch_id"]].parent_branch_id == "main"
    code, out, err = await reel(cfg, "rewind", run_id, "--at-step", "summarize", "--key", "k1")
    assert code == 0 and "(it already existed, made at lsn" in out, (out, err)  # a repeat says so

    code, out, err = await reel(cfg, "cancel", run_id, "--reason", "from the test", "--by", "bob")
    assert code == 0, err
    assert re.fullmatch(rf"run {run_id} cancelled at lsn \d+ \(was \w+\)", out.strip()), out
    (cancelled,) = [e for _, c in await event_log.read(run_id) for e in c.events if isinstance(e, RunCancelled)]
    assert (cancelled.by, cancelled.reason) == ("bob", "from the test")  # who, recorded with the commit
    code, out, err = await reel(cfg, "cancel", run_id, "--json")
    assert code == 0, err
    reply = json.loads(out.strip().splitlines()[-1])
    assert reply["ok"] and reply["status"] == "cancelled" and reply["detail"]["noop"] is True
    code, out, err = await reel(cfg, "cancel", run_id)
    assert code == 0 and out.strip() == f"run {run_id} not cancelled: run is already cancelled", (out, err)


async def test_command_line_errors_are_one_line_and_non_zero(cfg: Config) -> None:
    code, out, err = await reel(cfg, "cancel", "r-00000000000000000000")
    assert code == 1 and err.strip().splitlines()[-1].startswith("error: run_not_found"), (out, err)
    assert sum(line.startswith("error:") for line in err.splitlines()) == 1

    code, _, err = await reel(cfg, "rewind", "r-00000000000000000000")  # neither --at-step nor --at-lsn
    assert code == 2 and "exactly one of --at-step or --at-lsn" in err

    code, _, err = await reel(cfg, "run", "examples/does-not-exist.yaml")
    assert code == 1 and err.strip().splitlines() == [err.strip()] and "cannot read workflow" in err

    code, _, err = await reel(cfg, "show", "r-00000000000000000000")
    assert code == 1 and "run_not_found" in err
