"""Code identity end to end: a real nats-server, a real executor subprocess killed (-9) while a Python tool's attempt
runs, the tool's module edited, and another executor resuming the run: the second attempt records the new code,
``reel show`` marks it, and ``on_code_change: fail`` stops the resume instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from reel.services.executor.app import serve as executor_serve
from reel.services.timeline.render import timeline
from reel.shared.core.run.events import CodeIdentity, StepHalted
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.commands import ResumeRun, encode
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import REPO, running
from tests.integration.scenarios import attempt_of, wait_until
from tests.refold import assert_refold_identical

V1 = '''import pathlib, time


def work() -> str:
    (pathlib.Path(__file__).parent / "started").touch()
    time.sleep(120)  # killed with its executor before it returns
    return "v1"
'''
V2 = '''def work() -> str:
    return "v2"
'''


def _workflow(module: str, **extra: Any) -> Any:
    return parse_workflow({"name": "code-change", **extra, "steps": [{
        "kind": "agent", "id": "solve", "max_turns": 3,
        "context": [{"id": "task", "kind": "task", "text": "work"}],
        "model": {"adapter": "scripted", "turns": [{"tool_calls": [{"name": "work", "arguments": {}}]},
                                                   {"text": "done"}]},
        "tools": [{"name": "work", "description": "Work.", "python": f"{module}:work", "retry_safe": True,
                   "timeout_s": 60, "parameters": {"type": "object", "properties": {}}}]}]})


async def _edited_between_attempts(infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog,
                                   tmp_path: Path, **extra: Any) -> tuple[RunState, str, str]:
    """Start the run on an executor subprocess, kill it while the tool's first attempt runs, edit the tool's
    module, resume on an in-process executor; the state it rests in and the two versions' sha256."""
    folder = tmp_path / "tools"
    folder.mkdir(mode=0o755)
    module = f"codeid_tools_{uuid.uuid4().hex[:8]}"  # a name no other test imported in this process
    path = folder / f"{module}.py"
    path.write_text(V1)
    env = {**os.environ, "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace,
           "REEL_LEASE_TTL_S": str(cfg.lease_ttl_s), "REEL_LOG_FORMAT": "json", "REEL_COMMAND_ACK_WAIT_S": "120"}
    with (tmp_path / "executor.log").open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.executor", cwd=REPO,
                                                    env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
    try:
        started = await client.start(_workflow(module, **extra), source_dir=str(folder))
        assert started.ok and started.run_id, started
        await wait_until(lambda: asyncio.to_thread((folder / "started").exists), timeout_s=60,
                         what="the tool's first attempt to run")
    finally:
        proc.kill()
        await proc.wait()
    run = started.run_id
    held = await event_log.load(run)
    assert attempt_of(held, "solve:t1:c0", 1).status == "dispatched"
    path.write_text(V2)  # the deploy between the two attempts
    async with running(executor_serve, infra, cfg):
        assert (await client.command("resume", encode(ResumeRun(run_id=run)), timeout_s=15)).ok
        state = await client.wait_for(run, ("verifying", "completed"), timeout_s=60)
    await assert_refold_identical(event_log, state)
    return state, hashlib.sha256(V1.encode()).hexdigest(), hashlib.sha256(V2.encode()).hexdigest()


def _shown(state: RunState) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(timeline(state))
    return out.getvalue()


async def test_a_python_tool_edited_between_two_attempts_is_recorded_and_marked(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path,
) -> None:
    state, v1, v2 = await _edited_between_attempts(infra, cfg, client, event_log, tmp_path)
    first, second = attempt_of(state, "solve:t1:c0", 1), attempt_of(state, "solve:t1:c0", 2)
    assert isinstance(first.code, CodeIdentity) and isinstance(second.code, CodeIdentity)
    assert (first.code.kind, first.code.name, first.code.sha256) == ("python", "work", v1)
    assert second.code.sha256 == v2 and second.code.path == first.code.path
    assert first.code.version is None and first.code.reel  # a file of no distribution; the Reel version
    assert second.status == "succeeded" and first.executor_id != second.executor_id
    turn = attempt_of(state, "solve:t1", 1).code
    assert isinstance(turn, CodeIdentity) and (turn.kind, turn.name) == ("model", "scripted")
    shown = _shown(state)
    assert "succeeded (code changed)" in shown
    assert (f"solve:t1:c0#2: the code of python 'work' changed since solve:t1:c0#1: sha256 {v1[:12]} → {v2[:12]}"
            in shown)
    assert shown.count("(code changed)") == 1  # turn 2's model is the same code as turn 1's


async def test_on_code_change_fail_stops_the_resume_with_the_reason(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path,
) -> None:
    state, v1, v2 = await _edited_between_attempts(infra, cfg, client, event_log, tmp_path, on_code_change="fail")
    branch = state.branches["main"]
    assert [a.attempt for a in branch.attempts["solve:t1:c0"]] == [1], "the changed code must not run"
    halt = branch.halt
    assert isinstance(halt, StepHalted) and (halt.reason, halt.step_id) == ("code_changed", "solve:t1:c0")
    assert halt.message == (f"on_code_change: fail — the code of python 'work' changed since solve:t1:c0#1: "
                            f"sha256 {v1[:12]} → {v2[:12]}")
    assert branch.agents is not msgspec.UNSET
    finished = branch.agents["solve"].finished
    assert finished is not None and (finished.status, finished.error_kind) == ("failed", "code_changed")
    assert "end reason code_changed (before solve:t1:c0): on_code_change: fail" in _shown(state)
