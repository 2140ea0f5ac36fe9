"""``reel up`` looks after its embedded nats-server: a ``kill -9`` of it is said in one line and the server is
started again on the same port and store; Ctrl-C then stops everything without a traceback (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from reel.services.cli.supervisor import warn_other_accounts
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.embedded import embedded_server
from reel.shared.nats.infra import connect, ensure_infra
from reel.shared.runtime.config import Config
from tests.integration.scenarios import wait_until
from tests.integration.test_auth_cli import _free_port, reel

REPO = Path(__file__).resolve().parents[2]


def _nats_children(pid: int) -> list[int]:
    """The pids of the nats-server processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if comm == "nats-server" and int(rest[1]) == pid:
                found.append(int(entry.name))
    return found


async def _consuming(url: str) -> bool:
    """True once reel up's executor pulls on the commands stream of ``url``."""
    names = Names("reel")
    try:
        nc = await connect(Config(nats_url=url, names=names), name="t")
    except Exception:
        return False
    try:
        return bool((await nc.jetstream().consumer_info(names.commands_stream, names.consumer("executor"))).num_waiting)
    except Exception:
        return False
    finally:
        await nc.close()


async def test_reel_up_restarts_its_killed_server_and_stops_quietly(tmp_path: Path) -> None:
    env = {"REEL_HOME": str(tmp_path / "home"), "REEL_LOG_FORMAT": "json", "COLUMNS": "400"}
    port = _free_port()
    url = f"nats://127.0.0.1:{port}"
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", "up", "--port", str(port), cwd=REPO,
        env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await wait_until(lambda: _consuming(url), timeout_s=90, what="reel up's services to consume")
        (first,) = _nats_children(up.pid)
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: asyncio.to_thread(lambda: [p for p in _nats_children(up.pid) if p != first]),
                         timeout_s=30, what="reel up to start its nats-server again")
        await wait_until(lambda: _consuming(url), timeout_s=90, what="the services to reconnect")
        code, out, err = await reel("run", "examples/hello.yaml", "-q", "--nats-url", url, env=env)
        assert code == 0 and "outcome passed" in out, (out, err)
        assert up.returncode is None
        (second,) = _nats_children(up.pid)
        os.kill(second, signal.SIGKILL)  # and Ctrl-C while the server is down: the services stop quietly too
        await wait_until(lambda: asyncio.to_thread(lambda: not _nats_children(up.pid)), timeout_s=10,
                         what="the killed server to be reaped")
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
        _, err_b = await asyncio.wait_for(up.communicate(), 60)
    err = err_b.decode()
    said = [ln for ln in err.splitlines() if "nats-server (pid" in ln]
    assert len(said) == 2, err[-3000:]
    assert f"pid {first}) exited with signal SIGKILL" in said[0] and "nats-server.log" in said[0], said
    assert f"port {port}" in said[0] and f"pid {second}) exited" in said[1]
    assert "Traceback" not in err and "ConnectionReconnectingError" not in err, err[-3000:]
    assert up.returncode == 0, err[-2000:]


async def test_reel_up_warns_when_the_store_holds_another_accounts_streams(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = Names("reel")
    async with embedded_server(store_dir=str(tmp_path / "js")) as srv:  # `reel up` without --auth: account $G
        cfg = Config(nats_url=srv.url, names=names)
        nc = await connect(cfg, name="t")
        await ensure_infra(nc, cfg)
        await nc.close()
    warn_other_accounts(tmp_path / "js", names, auth=False)
    assert "warning" not in capsys.readouterr().err
    warn_other_accounts(tmp_path / "js", names, auth=True)  # then `reel up --auth`: account REEL
    err = capsys.readouterr().err
    assert "warning:" in err and "$G" in err and "REEL" in err, err
