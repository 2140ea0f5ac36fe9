"""No secret of a service crosses into a tool (docs/security.md "What crosses into a tool"), on a real
auth-on server.

The executor runs as its role, with its NATS credentials in its environment the way ``reel up`` gives
them (``REEL_NATS_USER``/``REEL_NATS_PASSWORD``) and a model key beside them. A ``command`` tool step
and an agent's ``command`` tool that print their whole environment show neither; a tool that names a
variable in ``pass_env`` gets exactly it. The canary test runs tools that do get the secrets (a
``pass_env``, python tools reading the executor's environment) and hand them out in outputs, errors
and log lines, then reads every message of every stream and bucket and every log line: the values
are nowhere, their ``[redacted:NAME]`` markers are.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import structlog
from nats.js.errors import NotFoundError

from shared.core.fold import RunState
from shared.core.workflow import parse_workflow
from shared.logging import setup_logging
from shared.nats.client import ReelClient
from tests.integration.authserver import AuthServer, auth_server, client_of, services_as_roles
from tests.integration.scenarios import attempt_of

KEY_ENV = "REEL_TEST_MODEL_KEY"
ENV_DUMP = [sys.executable, "-c", "import os; print('\\n'.join(f'{k}={v}' for k, v in sorted(os.environ.items())))"]


@pytest.fixture
async def server(tmp_path: Path) -> AuthServer:  # type: ignore[misc]
    async with auth_server(tmp_path) as srv:
        yield srv


def as_reel_up(server: AuthServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Put the executor's NATS credentials and a model key in this process's environment, as ``reel up``'s
    executor has them; returns name → value of each secret."""
    auth = server.dir.service_config("executor", server.base).auth
    assert auth.user and auth.password
    secrets = {"REEL_NATS_USER": auth.user, "REEL_NATS_PASSWORD": auth.password,
               KEY_ENV: f"sk-canary{uuid.uuid4().hex}", "REEL_TEST_PASSED": f"passed{uuid.uuid4().hex}"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    return secrets


async def outputs(client: ReelClient, state: RunState) -> dict[str, str]:
    """``step id#attempt`` → the output text of every attempt of the active branch that has one."""
    assert client.blobs is not None
    return {f"{sid}#{a.attempt}": (await client.blobs.get(a.output_ref)).decode()
            for sid, attempts in state.branches[state.active_branch].attempts.items()
            for a in attempts if a.output_ref is not None}


def env_workflow() -> dict[str, object]:
    return {"name": "env-dump", "steps": [
        {"kind": "tool", "id": "env", "tool": {"type": "command", "argv": ENV_DUMP, "pass_env": ["REEL_TEST_PASSED"],
                                               "env": {"SET_BY_SPEC": "yes"}}},
        {"kind": "agent", "id": "solve", "context": [{"id": "task", "kind": "task", "text": "dump the env"}],
         "model": {"adapter": "scripted", "api_key_env": KEY_ENV,
                   "turns": [{"tool_calls": [{"name": "env", "arguments": {}}]}, {"text": "done"}]},
         "tools": [{"name": "env", "command": ENV_DUMP}]},
    ]}


async def test_a_command_step_and_an_agent_command_tool_printing_env_show_no_nats_credentials_or_model_key(
        server: AuthServer, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = as_reel_up(server, monkeypatch)
    async with services_as_roles(server, "executor"), client_of(server) as client:
        started = await client.start(parse_workflow(env_workflow()))
        assert started.ok and started.run_id, started
        state = await client.wait_for(started.run_id, ("completed", "verifying"), timeout_s=60)
        out = await outputs(client, state)
    plain, agent = out["env#1"], out["solve:t1:c0#1"]
    for text in (plain, agent):
        names = {line.split("=", 1)[0] for line in text.splitlines() if "=" in line}
        assert "PATH" in names and "REEL_RUN_ID" in names, text
        assert not [n for n in names if n.startswith("REEL_NATS_")], text
        assert KEY_ENV not in names and secrets[KEY_ENV] not in text and secrets["REEL_NATS_PASSWORD"] not in text
    assert f"REEL_TEST_PASSED={secrets['REEL_TEST_PASSED']}" in plain and "SET_BY_SPEC=yes" in plain
    assert "REEL_TEST_PASSED" not in agent  # the agent's tool did not list it
    assert "REEL_IDEMPOTENCY_KEY=" in agent and "REEL_TOOL_NAME=env" in agent


def canary_workflow() -> dict[str, object]:
    leak_cmd = [sys.executable, "-c", f"import os; print('key', os.environ['{KEY_ENV}'])"]
    fail_cmd = [sys.executable, "-c", f"import os, sys; print('key', os.environ['{KEY_ENV}']); sys.exit(3)"]
    python = "tests.integration.secret_tools:"
    calls = [{"name": n, "arguments": {}} for n in ("leak", "leak_error", "leak_log", "cmd")]
    return {"name": "canary", "steps": [
        {"kind": "tool", "id": "env", "tool": {"type": "command", "argv": ENV_DUMP}},
        {"kind": "tool", "id": "passed", "tool": {"type": "command", "argv": leak_cmd, "pass_env": [KEY_ENV]}},
        {"kind": "agent", "id": "solve", "context": [{"id": "task", "kind": "task", "text": "leak it"},
                                                   {"id": "passed", "kind": "doc", "from_step": "passed"}],
         "model": {"adapter": "scripted", "api_key_env": KEY_ENV,
                   "turns": [{"tool_calls": calls}, {"text": "done"}]},
         "tools": [{"name": "leak", "python": python + "leak"}, {"name": "leak_error", "python": python + "leak_error"},
                   {"name": "leak_log", "python": python + "leak_log"},
                   {"name": "cmd", "command": leak_cmd, "pass_env": [KEY_ENV]}]},
        {"kind": "tool", "id": "fails", "tool": {"type": "command", "argv": fail_cmd, "pass_env": [KEY_ENV]}},
    ], "verifiers": [{"type": "command", "argv": ENV_DUMP},
                     {"type": "python", "name": "leaky", "path": python + "LeakyVerifier"}]}


async def every_stored_byte(server: AuthServer) -> tuple[bytes, list[str]]:
    """Every message (data and headers) of every stream of the account — the events and verdicts streams, the
    blob store's, every KV bucket's (outcomes, snapshots, leases…) — read as the operator; and the streams' names."""
    js = server.operator.js
    chunks, names = [], []
    for info in await js.streams_info():
        names.append(info.config.name or "")
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(info.config.name or "", seq)
            except NotFoundError:  # a deleted sequence (a purged chunk, an overwritten key)
                continue
            chunks.append((msg.data or b"") + repr(msg.headers or {}).encode())
    return b"\n".join(chunks), names


async def test_canary_secrets_reach_no_stream_bucket_blob_or_log_line(
        server: AuthServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    secrets = as_reel_up(server, monkeypatch)
    canaries = {k: v for k, v in secrets.items() if k in ("REEL_NATS_PASSWORD", KEY_ENV)}
    monkeypatch.setenv("REEL_LOG_FORMAT", "json")
    saved = {k: list(v) if isinstance(v, list) else v for k, v in structlog.get_config().items()}  # a copy
    setup_logging("executor", "INFO")  # the services' real chain, rendering to the captured stderr
    try:
        async with services_as_roles(server, "executor", "verifier"), client_of(server) as client:
            started = await client.start(parse_workflow(canary_workflow()))
            assert started.ok and started.run_id, started
            state = await client.wait_for(started.run_id, ("completed",), timeout_s=90)
            out = await outputs(client, state)
            verdicts = {v.verifier: v for v in await client.verdicts(started.run_id)}
    finally:
        structlog.configure(**saved)
    logs = capsys.readouterr().err
    stored, streams = await every_stored_byte(server)
    n = server.base.names
    assert {n.events_stream, f"OBJ_{n.blob_bucket}"} <= set(streams) and len(streams) >= 6, streams
    for name, value in canaries.items():
        assert value.encode() not in stored, f"{name} is stored"
        assert value not in logs, f"{name} is in a log line"
    assert "tool.leaking" in logs and "[redacted:REEL_NATS_PASSWORD]" in logs and f"[redacted:{KEY_ENV}]" in logs
    # the tools did hand them out: each is recorded as its marker
    assert out["passed#1"] == f"key [redacted:{KEY_ENV}]\n"
    assert f"[redacted:{KEY_ENV}]" in out["solve:t1:c3#1"]  # the agent's command tool
    leaked = out["solve:t1:c0#1"]
    assert "[redacted:REEL_NATS_PASSWORD]" in leaked and f"[redacted:{KEY_ENV}]" in leaked, leaked
    failed = attempt_of(state, "solve:t1:c1", 1)
    assert failed.error_message is not None and "[redacted:REEL_NATS_PASSWORD]" in failed.error_message
    assert verdicts["leaky"].reason == f"judged with [redacted:{KEY_ENV}]", verdicts
    fails = attempt_of(state, "fails", 1)
    assert fails.error_kind == "exit_3" and f"[redacted:{KEY_ENV}]" in (fails.error_message or "")
    assert b"[redacted:REEL_NATS_PASSWORD]" in stored and f"[redacted:{KEY_ENV}]".encode() in stored
