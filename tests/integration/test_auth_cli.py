"""``reel auth init``, ``reel --auth DIR …`` and ``reel up --auth`` as a user runs them (real processes and server)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import sys
from pathlib import Path

from reel.shared.auth.authdir import AuthDir
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.embedded import find_binary
from reel.shared.nats.infra import connect
from reel.shared.runtime.config import Config
from tests.integration.scenarios import wait_until

REPO = Path(__file__).resolve().parents[2]


async def reel(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> tuple[int, str, str]:
    """Run ``reel ARGS``; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", *args, cwd=REPO, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200", **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_auth_init_writes_a_valid_server_config_and_secret_files(tmp_path: Path) -> None:
    d = tmp_path / "auth"
    code, out, err = await reel("auth", "init", str(d), "--namespace", "acme", "--k8s")
    assert code == 0, err
    files = sorted(p.name for p in d.iterdir())
    assert {"auth.conf", "server.conf", "client.env", "executor.env", "operator.password",
            "k8s-secrets.yaml"} <= set(files)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert all(stat.S_IMODE((d / f).stat().st_mode) == 0o600 for f in files), "a credential file is readable by others"
    conf = (d / "auth.conf").read_text()
    client = AuthDir(d).env("client")
    assert client["REEL_NATS_USER"] == "client" and client["REEL_NAMESPACE"] == "acme"
    assert client["REEL_NATS_PASSWORD"] not in conf and "$2a$" in conf  # only hashes in the server config
    proc = await asyncio.create_subprocess_exec(find_binary(), "-t", "-c", str(d / "server.conf"),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    check = (await proc.communicate())[0].decode()
    assert proc.returncode == 0 and "is valid" in check, check

    code, out, err = await reel("auth", "init", str(d))  # never overwritten by accident
    assert code == 1 and err.strip().startswith("error:") and "--force" in err, (out, err)
    assert AuthDir(d).env("client") == client
    code, out, err = await reel("auth", "init", str(d), "--if-missing")
    assert code == 0 and AuthDir(d).env("client") == client, err


async def test_reel_with_auth_runs_an_embedded_auth_on_server(tmp_path: Path) -> None:
    env = {"REEL_HOME": str(tmp_path / "home")}
    code, _, err = await reel("auth", "init", str(tmp_path / "auth"), env=env)
    assert code == 0, err
    code, out, err = await reel("--auth", str(tmp_path / "auth"), "run", "examples/hello.yaml", "-q", env=env)
    assert code == 0, (out, err)
    assert "completed" in out and "outcome passed" in out
    run_id = out.split()[1]
    # reads through an ordered consumer with no service running: the command's own consumer gate vets it
    code, out, err = await reel("--auth", str(tmp_path / "auth"), "verdicts", run_id, env=env)
    assert code == 0 and "greeting-printed" in out, (out, err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_reel_up_with_auth_serves_clients_that_log_in(tmp_path: Path) -> None:
    env = {"REEL_HOME": str(tmp_path / "home"), "REEL_LOG_FORMAT": "json"}
    port = _free_port()
    url = f"nats://127.0.0.1:{port}"
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", "up", "--auth", "--port", str(port), cwd=REPO,
        env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    auth = AuthDir(tmp_path / "home" / "auth")
    try:
        await wait_until(lambda: asyncio.to_thread(auth.exists), timeout_s=30, what="reel up --auth to write users")
        names = Names("reel")
        op = None

        async def consuming() -> bool:  # reel up's executor and verifier children are logged in and pulling
            nonlocal op
            try:
                op = op or await connect(auth.config("operator", Config(nats_url=url, names=names)), name="t")
                infos = [await op.jetstream().consumer_info(s, names.consumer(c)) for s, c in (
                    (names.commands_stream, "executor"), (names.commands_stream, "verifier"))]
            except Exception:
                return False
            return all(i.num_waiting for i in infos)

        await wait_until(consuming, timeout_s=90, what="reel up's services to consume")
        assert op is not None
        await op.close()
        for service, role in (("executor", "executor"), ("recovery", "mutators")):  # the readiness probe, as its role
            probe = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "reel.services.runtime.health", service, cwd=REPO, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env={**os.environ, **auth.env(role), "NATS_URL": url})
            said = (await asyncio.wait_for(probe.communicate(), 60))[0].decode()
            assert probe.returncode == 0 and "ok" in said, said
        client_env = {**env, **auth.env("client")}  # a client: `set -a; . auth/client.env`
        code, out, err = await reel("run", "examples/hello.yaml", "-q", "--nats-url", url, env=client_env)
        assert code == 0 and "outcome passed" in out, (out, err)
        code, out, err = await reel("ls", "--nats-url", url, env=client_env)
        assert code == 0 and "hello" in out, err

        code, out, err = await reel("ls", "--nats-url", url, env=env)  # no credentials
        assert code == 1 and err.strip().splitlines()[-1].startswith("error:") and "refused" in err, (out, err)
        wrong = {**client_env, "REEL_NATS_PASSWORD": "not-the-password-x9"}
        code, out, err = await reel("ls", "--nats-url", url, env=wrong)
        assert code == 1 and "refused the login as NATS user 'client'" in err, (out, err)
        assert "not-the-password-x9" not in out + err and client_env["REEL_NATS_PASSWORD"] not in out + err
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
        out_b, err_b = await asyncio.wait_for(up.communicate(), 60)
    logs = out_b.decode() + err_b.decode()
    assert auth.env("executor")["REEL_NATS_PASSWORD"] not in logs  # no secret in any service's log
    assert "nats.permission_denied" not in logs, logs[-3000:]
