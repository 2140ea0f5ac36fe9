"""``reel up`` and ``reel run`` started together: one writer per run, every tool ran once.

``reel run`` asks micro discovery whether an executor serves the server it connects to; while ``reel up``'s
services are still starting it may run its own beside them — then two live executors meet the same runs, and
the claim rule (a run whose owner holds a lease is never claimed) keeps each run to one writer. Real
processes: ``reel up`` (its embedded nats-server and service children) and concurrent ``reel run`` commands.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from reel.services.cli.embed import server_listening
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import connect
from reel.shared.runtime.config import Config
from tests.faults.checks import read_side_effects, side_effect_tool
from tests.integration.scenarios import wait_until
from tests.integration.test_auth_cli import _free_port, reel

pytestmark = [pytest.mark.faults, pytest.mark.slow,
              pytest.mark.timeout(1200)]  # 50 runs: 503 s on a 2-core machine at load 20-34 (about 100 s a wave)

REPO = Path(__file__).resolve().parents[2]
WAVES = 5
RUNS_PER_WAVE = 10  # 50 runs in all, each wave a fresh ``reel up`` started together with its ``reel run``s


def _workflow(path: Path, effects: Path) -> Path:
    spec = {"name": "startup-race", "steps": [
        {"kind": "tool", "id": s, "max_attempts": 3, "tool": side_effect_tool(effects, f"out of {s}", sleep_s=0.3)}
        for s in ("s1", "s2")]}
    path.write_text(json.dumps(spec))
    return path


async def _attempts(url: str, run_ids: list[str]) -> dict[str, Counter[str]]:
    """Per run: how many attempts each step has on the root branch."""
    nc = await connect(Config(nats_url=url, names=Names("reel")), name="t")
    try:
        log = JetStreamEventLog(nc, Names("reel"))
        out = {}
        for rid in run_ids:
            state = await log.load(rid)
            out[rid] = Counter({str(step): len(atts) for b in state.branches.values()
                                for step, atts in b.attempts.items()})
        return out
    finally:
        await nc.close()


async def test_reel_up_and_reel_run_started_together_run_each_tool_once(tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    wf = _workflow(tmp_path / "race.json", effects)
    env = {"REEL_HOME": str(tmp_path / "home"), "REEL_LOG_FORMAT": "json"}  # the default lease TTL (5 s): 11
    # processes start at once on a small machine, and one starved of CPU past a 2 s lease rightly gives its runs up
    run_ids: list[str] = []
    for wave in range(WAVES):
        port = _free_port()
        url = f"nats://127.0.0.1:{port}"
        up = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reel.services.cli", "up", "--port", str(port), cwd=REPO,
            env={**os.environ, **env}, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            await wait_until(lambda p=port: server_listening(port=p), timeout_s=60, what="reel up's nats-server")
            results = await asyncio.gather(*(reel("run", str(wf), "-q", "--nats-url", url, "--timeout", "90",
                                                  env=env, timeout_s=180) for _ in range(RUNS_PER_WAVE)))
            for code, out, err in results:
                assert code == 0, (wave, out[-2000:], err[-3000:])
                run_ids.append(re.search(r"run (\S+) (created|already existed)", out).group(1))  # type: ignore[union-attr]
            counts = await _attempts(url, run_ids[-RUNS_PER_WAVE:])
        finally:
            up.send_signal(signal.SIGINT)
            await asyncio.wait_for(up.communicate(), 90)
        for rid, per_step in counts.items():
            assert per_step == Counter({"s1": 1, "s2": 1}), (wave, rid, per_step)
    lines = Counter(":".join(ln.split(":")[:2]) for ln in read_side_effects(effects))
    assert len(run_ids) == WAVES * RUNS_PER_WAVE
    twice = {k: n for k, n in lines.items() if n != 1}
    assert not twice, f"tools that ran more than once: {twice}"
    assert len(lines) == 2 * len(run_ids)
