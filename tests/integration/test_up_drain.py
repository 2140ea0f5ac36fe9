"""Ctrl-C of ``reel up`` while an attempt runs: the executor lets it finish (its drain deadline, 45 s by default,
longer than the supervisor's 15 s kill grace of the other services) while the other services keep serving, and
``reel up`` exits 0 once everything stopped; a second Ctrl-C ends the drain at once, the attempt recorded
``interrupted``. Real processes: ``reel up`` with its embedded nats-server and service children, real SIGINTs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reel.shared.core.run.state import AttemptState
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.embedded import embedded_server
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import connect
from reel.shared.runtime.config import Config
from tests.integration.scenarios import wait_until
from tests.integration.test_auth_cli import _free_port, reel
from tests.integration.test_up_supervise import _consuming

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def _workflow(path: Path, seconds: int, done: Path) -> Path:
    path.write_text(f"""name: nap
steps:
  - kind: tool
    id: nap
    tool: {{type: command, argv: ["sh", "-c", "sleep {seconds}; touch {done}"]}}
""")
    return path


async def _nap(url: str, run_id: str) -> list[AttemptState]:
    """The attempts of step ``nap`` of ``run_id`` on the main branch ([] before the run exists)."""
    nc = await connect(Config(nats_url=url, names=Names("reel")), name="t")
    try:
        state = await JetStreamEventLog(nc, Names("reel")).load(run_id)
        return list(state.branches["main"].attempts.get("nap", ()))
    except Exception:
        return []
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def _up_running(tmp_path: Path, seconds: int) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, str]]:
    """``reel up`` with a run whose one attempt (a command sleeping ``seconds`` s) is in flight: (its process, its
    URL, the run id); killed on the way out if it still runs."""
    env = {"REEL_HOME": str(tmp_path / "home"), "REEL_LOG_FORMAT": "json", "COLUMNS": "400"}
    port = _free_port()
    url = f"nats://127.0.0.1:{port}"
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", "up", "--port", str(port), cwd=REPO,
        env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        yield up, url, await _started(up, url, tmp_path, seconds, env)
    finally:
        if up.returncode is None:
            up.kill()
            await up.wait()


async def _started(up: asyncio.subprocess.Process, url: str, tmp_path: Path, seconds: int,
                   env: dict[str, str]) -> str:
    """The run id of a ``nap`` run started on ``reel up`` at ``url``, once its attempt is dispatched."""
    await wait_until(lambda: _consuming(url), timeout_s=90, what="reel up's services to consume")
    wf = _workflow(tmp_path / "nap.yaml", seconds, tmp_path / "done")
    code, out, err = await reel("run", str(wf), "-q", "--timeout", "1", "--nats-url", url, env=env)
    assert code == 5, (out, err)  # left running: reel up's executor drives it
    run_id = re.search(r"run (\S+) created", out).group(1)  # type: ignore[union-attr]
    assert f"it goes on under the running services; `reel show {run_id} --follow` follows it" in " ".join(
        err.split()), err
    await wait_until(lambda: _nap(url, run_id), timeout_s=60, what="the attempt to be dispatched")
    return run_id


async def _line(up: asyncio.subprocess.Process, starting: str) -> str:
    assert up.stdout is not None
    while not (line := (await asyncio.wait_for(up.stdout.readline(), 60)).decode()).startswith(starting):
        assert line, f"reel up ended before printing {starting!r}"
    return line


async def test_ctrl_c_of_reel_up_lets_the_attempt_in_flight_finish(tmp_path: Path) -> None:
    async with _up_running(tmp_path, 20) as (up, url, run_id):  # 20 s: past the 15 s after which a child is killed
        up.send_signal(signal.SIGINT)
        assert "up to 45 s" in await _line(up, "stopping:")
        await _line(up, "stopped")
        assert await asyncio.wait_for(up.wait(), 90) == 0
    assert (tmp_path / "done").exists(), "the tool ran to its end"
    (attempt,) = await _serve_and_read(tmp_path, url, run_id)
    assert attempt.status == "succeeded", attempt


async def test_a_second_ctrl_c_interrupts_the_attempt_and_records_it(tmp_path: Path) -> None:
    async with _up_running(tmp_path, 120) as (up, url, run_id):
        up.send_signal(signal.SIGINT)
        await _line(up, "stopping:")
        up.send_signal(signal.SIGINT)
        await _line(up, "interrupting the attempts in flight")
        await _line(up, "stopped")
        assert await asyncio.wait_for(up.wait(), 60) == 0
    assert not (tmp_path / "done").exists(), "the tool was killed"
    (attempt,) = await _serve_and_read(tmp_path, url, run_id)
    assert (attempt.status, attempt.error_kind) == ("failed", "interrupted"), attempt


async def _serve_and_read(tmp_path: Path, url: str, run_id: str) -> list[AttemptState]:
    """The nap attempts as the stopped ``reel up`` left them, read from its store under a bare nats-server."""
    port = int(url.rsplit(":", 1)[1])
    async with embedded_server(port=port, store_dir=str(tmp_path / "home" / "js")):
        return await wait_until(lambda: _nap(url, run_id), timeout_s=30, what="the run in the store")
