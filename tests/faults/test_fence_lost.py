"""An executor that loses a run's fence while it still holds its lease kills the tools it started for that run and
writes nothing more to it.

Executor A (a real process) drives an agent whose turn calls a slow command tool. While the tool runs, another
writer takes the run over — a fenced commit of ``run_started`` for another executor, as a takeover's claim is. A's
lease is never lost (it keeps renewing). A finds the takeover in the run's log, SIGKILLs the tool's process group
at once (it never writes its ``done`` line) and writes nothing after the takeover: no commit, no outcome marker.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from reel.shared.core.run.events import RunStarted
from reel.shared.core.run.ids import ExecutorId
from reel.shared.core.wire.subjects import outcome_key
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.clock import now_ms
from reel.shared.runtime.config import Config
from tests.faults.checks import read_side_effects
from tests.faults.procs import ServiceProcs
from tests.faults.scenario import fault_cfg
from tests.integration.scenarios import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

SLOW_S = 60
"""How long the tool would run (s): far longer than the test waits for it to be killed."""
CALL = "a:t1:c0"


def _spec(effects: Path) -> dict[str, object]:
    script = f'printf "start:%s\\n" "$$" >> "$1"; sleep {SLOW_S}; printf "done\\n" >> "$1"; echo finished'
    return {"name": "fence-lost", "steps": [{
        "kind": "agent", "id": "a", "max_turns": 3, "context": [{"id": "task", "kind": "task", "text": "run slow"}],
        "model": {"adapter": "scripted", "turns": [{"tool_calls": [{"name": "slow", "arguments": {}}]},
                                                   {"text": "ok"}]},
        "tools": [{"name": "slow", "description": "a slow command", "parameters": {"type": "object"},
                   "command": ["sh", "-c", script, "slow", str(effects)], "timeout_s": SLOW_S * 2}]}]}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


async def test_a_run_taken_over_while_its_tool_runs_kills_the_tool_and_writes_nothing(
    infra: Infra, cfg: Config, client: ReelClient, tmp_path: Path,
) -> None:
    cfg = fault_cfg(cfg)
    effects = tmp_path / "effects.txt"
    log = JetStreamEventLog(infra.nc, cfg.names)
    async with ServiceProcs(cfg, tmp_path) as procs:
        a = await procs.start("executor")
        reply = await client.start(_spec(effects), timeout_s=60)
        assert reply.ok and reply.run_id, reply
        run_id = reply.run_id
        started = await wait_until(lambda: asyncio.to_thread(
            lambda: [ln for ln in read_side_effects(effects) if ln.startswith("start:")]),
            timeout_s=60, what="the slow tool to start")
        tool_pid = int(started[0].split(":")[1])
        state = await log.load(run_id)
        a_id = state.executor_id
        branch = state.active_branch
        assert a_id and state.branches[branch].attempts[CALL][-1].status == "dispatched", state
        takeover = await log.commit(run_id, [RunStarted(executor_id=ExecutorId("x-taker"), at_ms=now_ms())],
                                    expected_lsn=state.head_lsn, writer="x-taker")
        await wait_until(lambda: asyncio.to_thread(lambda: not _alive(tool_pid)), timeout_s=20,
                         what="A to kill the tool of the run it lost")
        await wait_until(lambda: asyncio.to_thread(lambda: '"run.lost"' in a.log_path.read_text(errors="replace")),
                         timeout_s=20, what="A to stop driving the run")
        commits = await log.read(run_id)
        try:
            marker = (await infra.outcomes.get(outcome_key(run_id, branch, CALL, 1))).value
        except Exception:
            marker = None
        a_log = a.log_path.read_text(errors="replace")
        alive = a.alive
    after = [(lsn, c.writer, [type(e).__name__ for e in c.events]) for lsn, c in commits if lsn > takeover]
    assert after == [], f"commits after the takeover: {after}"
    assert marker is None, f"an outcome marker of the stale call: {marker!r}"
    assert "done" not in read_side_effects(effects)
    assert "lease.lost" not in a_log and alive, "A's lease was held throughout (this is not the lease-loss path)"
