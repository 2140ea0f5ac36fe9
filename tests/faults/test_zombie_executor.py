"""A frozen executor is fenced from the world, not only from the log: SIGSTOP past its lease, then SIGCONT.

Executor A (a real process) dispatches attempt 1 of a slow command tool and is frozen (SIGSTOP) while the tool
runs. Its lease expires; recovery resolves A's attempt (``executor_lost``, outcome unknown) and a second
executor B takes the run over and completes it. Then A is resumed (SIGCONT): it finds its lease lost, kills its
tool at once, and writes nothing — no commit and no outcome marker — after B's takeover. The log, the outcome
markers and the side effects agree: the stale tool never reached its end.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from reel.shared.core.wire.subjects import outcome_key
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.faults.checks import read_side_effects
from tests.faults.conftest import FaultsLedger
from tests.faults.procs import ServiceProcs
from tests.faults.scenario import fault_cfg
from tests.integration.scenarios import wait_until

pytestmark = pytest.mark.faults

LOST_MARKER = b"lost"  # mutators.recovery.LOST_MARKER (spelled out: the test also runs on code without it)

SLOW_S = 60
"""How long attempt 1's tool would run (s): far longer than the test, so only a kill ends it early."""


def _tool(effects: Path) -> dict[str, object]:
    """Attempt 1 writes ``start:1:<pid>``, sleeps :data:`SLOW_S`, writes ``end:1``; later attempts at once."""
    script = ('printf "start:%s:%s\\n" "$REEL_ATTEMPT" "$$" >> "$1"; '
              f'if [ "$REEL_ATTEMPT" = 1 ]; then sleep {SLOW_S}; fi; '
              'printf "end:%s\\n" "$REEL_ATTEMPT" >> "$1"; printf done')
    return {"type": "command", "argv": ["sh", "-c", script, "zombie", str(effects)], "timeout_s": SLOW_S * 2}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


async def test_a_frozen_executor_resumed_after_its_takeover_kills_its_tool_and_writes_nothing(
    infra: Infra, cfg: Config, client: ReelClient, tmp_path: Path, faults_ledger: FaultsLedger,
) -> None:
    cfg = fault_cfg(cfg)
    effects = tmp_path / "effects.txt"
    log = JetStreamEventLog(infra.nc, cfg.names)
    spec = {"name": "zombie", "steps": [{"kind": "tool", "id": "slow", "max_attempts": 3, "tool": _tool(effects)}]}
    async with ServiceProcs(cfg, tmp_path) as procs:
        a = await procs.start("executor")
        await procs.start("verifier")
        await procs.start("recovery")
        reply = await client.start(spec, timeout_s=60)
        assert reply.ok and reply.run_id, reply
        run_id = reply.run_id
        started = await wait_until(lambda: asyncio.to_thread(
            lambda: [ln for ln in read_side_effects(effects) if ln.startswith("start:1:")]),
            timeout_s=60, what="attempt 1's tool to start")
        tool_pid = int(started[0].split(":")[2])
        a.process.send_signal(signal.SIGSTOP)
        try:
            a_id = (await log.read(run_id))[0][1].writer  # A took the start: run_created is its commit
            b = await procs.start("executor")

            async def taken_over() -> bool:
                state = await log.load(run_id)
                return state.executor_id not in (None, a_id) and state.status == "completed"
            await wait_until(taken_over, timeout_s=90, what="B to take the run over and complete it")
            assert _alive(tool_pid), "the frozen executor's tool should still be running (it sleeps)"
        finally:
            a.process.send_signal(signal.SIGCONT)
        await wait_until(lambda: asyncio.to_thread(lambda: "lease.lost" in a.log_path.read_text(errors="replace")),
                         timeout_s=30, what="A to find its lease lost")
        await wait_until(lambda: asyncio.to_thread(lambda: not _alive(tool_pid)), timeout_s=10,
                         what="A to kill its stale tool")

        async def resolved() -> object:
            st = await log.load(run_id)
            first = st.active.attempts["slow"][0]
            return first if first.status != "dispatched" else None
        att1 = await wait_until(resolved, timeout_s=30, what="recovery to resolve A's attempt 1")
        state = await log.load(run_id)
        commits = await log.read(run_id)
        takeover = min(lsn for lsn, c in commits if c.writer not in (a_id, "recovery") and lsn > 1)
        after = [(lsn, c.writer) for lsn, c in commits if lsn >= takeover and c.writer == a_id]
        try:
            marker = (await infra.outcomes.get(outcome_key(run_id, state.active_branch, "slow", 1))).value
        except Exception:
            marker = None
        lines = read_side_effects(effects)
        procs_alive = b.alive
    assert after == [], f"commits of the frozen executor after the takeover: {after}"
    assert att1.status == "failed" and att1.error_kind == "executor_lost", att1
    assert "outcome is unknown" in (att1.error_message or ""), att1.error_message
    assert marker in (None, LOST_MARKER), f"a marker for the stale attempt: {marker!r}"
    assert "end:1" not in lines, lines
    assert lines.count("end:2") == 1, lines
    assert procs_alive
    faults_ledger.record("zombie executor", 1, 0, 0, 0)
