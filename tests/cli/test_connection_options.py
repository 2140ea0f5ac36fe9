"""The connection options in both positions: ``reel --nats-url URL CMD`` as ``reel CMD --nats-url URL``; and a URL
where nothing listens is refused at once, in one line that says so (not a 10 s wait for an answer)."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

from reel.shared.runtime.config import Config
from tests.ui.support import REPO, env_for


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, never listening: a connect to it is refused (ECONNREFUSED)
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def _reel(*args: str, env: dict[str, str]) -> tuple[int, str, str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reel.services.cli", *args, cwd=REPO, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - started


async def test_nats_url_and_namespace_work_before_the_command(cfg: Config, tmp_path: Path) -> None:
    env = env_for(tmp_path)
    code, out, err, _ = await _reel("--nats-url", cfg.nats_url, "--namespace", cfg.names.namespace, "ls", env=env)
    assert code == 0 and "No such option" not in err, (code, out, err)
    code, out, err, _ = await _reel("--nats-url", cfg.nats_url, "--namespace", cfg.names.namespace, "show",
                                    "r-00000000000000000000", env=env)
    assert code == 1 and "run_not_found" in err, (code, out, err)  # reached the test server, in that namespace


async def test_a_refused_connection_says_so_at_once(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{_closed_port()}"
    for args in (["--nats-url", url, "ls"], ["ls", "--nats-url", url]):
        code, _out, err, took_s = await _reel(*args, env=env_for(tmp_path))
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 1 and lines == [f"error: unreachable: connection refused at {url}: no NATS server listens "
                                       "there (start `reel up`, or check --nats-url)"], (args, code, err)
        assert took_s < 8, took_s  # the process's start included; was > 10 s (the connect timeout)


async def test_a_url_whose_host_does_not_resolve_says_so_at_once(tmp_path: Path) -> None:
    code, _out, err, took_s = await _reel("--nats-url", "no-such-host.invalid", "ls", env=env_for(tmp_path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, err
    assert "no host 'no-such-host.invalid' (the name does not resolve" in lines[0], err
    assert took_s < 8, took_s  # the process's start included; was > 10 s (the connect timeout)


async def test_a_url_that_does_not_parse_is_one_error_line(tmp_path: Path) -> None:
    code, _out, err, _took_s = await _reel("--nats-url", "nats://u:secret@[::1", "ls", env=env_for(tmp_path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and lines == ["error: unreachable: not a NATS URL: 'nats://***@[::1' (Invalid IPv6 URL); "
                                   "--nats-url takes nats://HOST:PORT, comma-separated for a cluster"], err


async def test_an_http_url_is_refused_at_once_as_not_nats(tmp_path: Path) -> None:
    code, _out, err, _took_s = await _reel("--nats-url", "http://127.0.0.1:4222", "ls", env=env_for(tmp_path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and lines == ["error: unreachable: not a NATS URL: 'http://127.0.0.1:4222' (scheme http: NATS "
                                   "speaks nats, tls, ws, wss); --nats-url takes nats://HOST:PORT, comma-separated "
                                   "for a cluster"], err
