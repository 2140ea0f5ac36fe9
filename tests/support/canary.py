"""The secrets a tool must never see, and the places they must never reach, on a real auth-on server.

Shared by the integration test (tests/integration/test_tool_secrets.py) and the security suite
(tests/security): :func:`as_reel_up` puts the executor's NATS credentials and a model key in the
environment the way ``reel up`` gives them; :func:`env_workflow` prints a tool's whole environment
(a ``command`` step and an agent's ``command`` tool); :func:`canary_workflow` runs tools that do get
the secrets and hand them out in outputs, errors, verdicts and log lines; :func:`every_stored_byte`
reads every message of every stream of the account (events, verdicts, blobs, every KV bucket).
"""

from __future__ import annotations

import sys
import uuid

import pytest
from nats.js.errors import NotFoundError

from reel.shared.core.run.state import RunState
from reel.shared.nats.client import ReelClient
from tests.integration.authserver import AuthServer

KEY_ENV = "REEL_TEST_MODEL_KEY"
"""The model key variable the workflows name (``api_key_env``)."""
ENV_DUMP = [sys.executable, "-c", "import os; print('\\n'.join(f'{k}={v}' for k, v in sorted(os.environ.items())))"]
"""argv of a command that prints its whole environment, one ``NAME=value`` a line."""
SECRET_TOOLS = "tests.integration.secret_tools:"
"""The module of the python tools that try to hand the executor's secrets out."""


def as_reel_up(server: AuthServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Put the executor's NATS credentials and a model key in this process's environment, as ``reel up``'s
    executor has them; returns name → value of each secret (and of ``REEL_TEST_PASSED``, a variable a spec passes)."""
    auth = server.dir.service_config("executor", server.base).auth
    assert auth.user and auth.password
    secrets = {"REEL_NATS_USER": auth.user, "REEL_NATS_PASSWORD": auth.password,
               KEY_ENV: f"sk-canary{uuid.uuid4().hex}", "REEL_TEST_PASSED": f"passed{uuid.uuid4().hex}"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    return secrets


def canaries(secrets: dict[str, str]) -> dict[str, str]:
    """The values of :func:`as_reel_up` that nothing may store: the executor's NATS password and the model key."""
    return {k: v for k, v in secrets.items() if k in ("REEL_NATS_PASSWORD", KEY_ENV)}


async def outputs(client: ReelClient, state: RunState) -> dict[str, str]:
    """``step id#attempt`` → the output text of every attempt of the active branch that has one."""
    assert client.blobs is not None
    return {f"{sid}#{a.attempt}": (await client.blobs.get(a.output_ref)).decode()
            for sid, attempts in state.active.attempts.items()
            for a in attempts if a.output_ref is not None}


def env_names(text: str) -> set[str]:
    """The variable names of an :data:`ENV_DUMP` output."""
    return {line.split("=", 1)[0] for line in text.splitlines() if "=" in line}


def env_workflow() -> dict[str, object]:
    """A ``command`` step (passing ``REEL_TEST_PASSED``, setting ``SET_BY_SPEC``) and an agent ``command`` tool
    (step ``solve``, call ``solve:t1:c0``) that print their environment."""
    return {"name": "env-dump", "steps": [
        {"kind": "tool", "id": "env", "tool": {"type": "command", "argv": ENV_DUMP, "pass_env": ["REEL_TEST_PASSED"],
                                               "env": {"SET_BY_SPEC": "yes"}}},
        {"kind": "agent", "id": "solve", "context": [{"id": "task", "kind": "task", "text": "dump the env"}],
         "model": {"adapter": "scripted", "api_key_env": KEY_ENV,
                   "turns": [{"tool_calls": [{"name": "env", "arguments": {}}]}, {"text": "done"}]},
         "tools": [{"name": "env", "command": ENV_DUMP}]},
    ]}


def canary_workflow() -> dict[str, object]:
    """Tools that get the secrets (``pass_env``, python tools reading the executor's environment) and hand them
    out: printed, returned, raised, logged, in a failing command's output and in a python verifier's reason."""
    leak_cmd = [sys.executable, "-c", f"import os; print('key', os.environ['{KEY_ENV}'])"]
    fail_cmd = [sys.executable, "-c", f"import os, sys; print('key', os.environ['{KEY_ENV}']); sys.exit(3)"]
    python = SECRET_TOOLS
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
        if not info.state.messages:  # an empty stream: first_seq 0, which no get answers
            continue
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(info.config.name or "", seq)
            except NotFoundError:  # a deleted sequence (a purged chunk, an overwritten key)
                continue
            chunks.append((msg.data or b"") + repr(msg.headers or {}).encode())
    return b"\n".join(chunks), names
