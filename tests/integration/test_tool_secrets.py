"""No secret of a service crosses into a tool (docs/security.md "What a tool sees"), on a real auth-on server.

The executor runs as its role, with its NATS credentials in its environment the way ``reel up`` gives
them (``REEL_NATS_USER``/``REEL_NATS_PASSWORD``) and a model key beside them. A ``command`` tool step
and an agent's ``command`` tool that print their whole environment show neither; a tool that names a
variable in ``pass_env`` gets exactly it.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from shared.core.fold import RunState
from shared.core.workflow import parse_workflow
from shared.nats.client import ReelClient
from tests.integration.authserver import AuthServer, auth_server, client_of, services_as_roles

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
