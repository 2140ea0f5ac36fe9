"""The services' health signal (services/runtime/health.py): the heartbeat, the liveness and the readiness checks."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from reel.services.runtime import health
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config


def test_live_reads_the_age_of_the_heartbeat(tmp_path: Path) -> None:
    beat = tmp_path / "heartbeat"
    with pytest.raises(health.Unhealthy, match="not serving yet"):
        health.live(beat, 30)
    beat.touch()
    os.utime(beat, (time.time() - 10, time.time() - 10))
    assert health.live(beat, 30).startswith("ok: heartbeat 10.")
    with pytest.raises(health.Unhealthy, match=r"10 s old \(> 5 s\): the event loop is stuck"):
        health.live(beat, 5)


def test_the_probe_exits_1_with_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(health.HEARTBEAT_ENV, raising=False)
    assert health.main(["--live"]) == 1
    assert capsys.readouterr().err == \
        f"unhealthy: ${health.HEARTBEAT_ENV} is not set: this service writes no heartbeat\n"
    monkeypatch.setenv(health.HEARTBEAT_ENV, str(tmp_path / "beat"))
    (tmp_path / "beat").touch()
    assert health.main(["--live"]) == 0
    assert capsys.readouterr().out.startswith("ok: heartbeat")


async def test_heartbeat_touches_its_file_at_once_and_stops_on_an_unwritable_one(tmp_path: Path) -> None:
    beat = tmp_path / "home" / "heartbeat"
    task = asyncio.create_task(health.heartbeat(beat, every_s=3600))
    await asyncio.sleep(0)  # the task runs to its first wait: the first touch is before it
    assert beat.is_file()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (tmp_path / "file").touch()
    await asyncio.wait_for(health.heartbeat(tmp_path / "file" / "heartbeat"), 5)  # logged, returns


async def test_ready_checks_the_services_consumer(cfg: Config, infra: Infra) -> None:
    assert await health.ready(cfg, None) == f"ok: NATS and JetStream at {cfg.nats_url}"
    missing = f"verifier is not consuming: no consumer {cfg.names.consumer('verifier')} on {cfg.names.commands_stream}"
    with pytest.raises(health.Unhealthy, match=missing):
        await health.ready(cfg, "verifier")
