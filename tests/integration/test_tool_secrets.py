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

from pathlib import Path

import pytest
import structlog

from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.runtime.logging import setup_logging
from tests.integration.authserver import AuthServer, auth_server, client_of, services_as_roles
from tests.integration.scenarios import attempt_of
from tests.support.canary import (
    KEY_ENV,
    as_reel_up,
    canaries,
    canary_workflow,
    env_names,
    env_workflow,
    every_stored_byte,
    outputs,
)


@pytest.fixture
async def server(tmp_path: Path) -> AuthServer:  # type: ignore[misc]
    async with auth_server(tmp_path) as srv:
        yield srv


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
        names = env_names(text)
        assert "PATH" in names and "REEL_RUN_ID" in names, text
        assert not [n for n in names if n.startswith("REEL_NATS_")], text
        assert KEY_ENV not in names and secrets[KEY_ENV] not in text and secrets["REEL_NATS_PASSWORD"] not in text
    assert f"REEL_TEST_PASSED={secrets['REEL_TEST_PASSED']}" in plain and "SET_BY_SPEC=yes" in plain
    assert "REEL_TEST_PASSED" not in agent  # the agent's tool did not list it
    assert "REEL_IDEMPOTENCY_KEY=" in agent and "REEL_TOOL_NAME=env" in agent
    reel = {name: {n for n in env_names(text) if n.startswith("REEL_")} for name, text in (("plain", plain),
                                                                                             ("agent", agent))}
    assert reel["plain"] - {"REEL_TEST_PASSED"} == reel["agent"] - {"REEL_TOOL_ARGS"}, reel  # one call identity
    assert f"REEL_IDEMPOTENCY_KEY={started.run_id}/main/env" in plain and "REEL_TOOL_NAME=env" in plain


async def test_canary_secrets_reach_no_stream_bucket_blob_or_log_line(
        server: AuthServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    secrets = as_reel_up(server, monkeypatch)
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
    for name, value in canaries(secrets).items():
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
