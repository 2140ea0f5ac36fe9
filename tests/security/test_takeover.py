"""The leaked-password takeover, and the canary grep over everything stored and logged.

The takeover as it once went: a client runs a command step printing ``env``, reads the executor's
``REEL_NATS_USER``/``REEL_NATS_PASSWORD`` and the model key from the run's output (``reel show``), and
with that password publishes a forged ``run_created`` that recovery picks up and the executor runs.
Here the dump must hold no ``REEL_NATS_*`` and no model key, and the client's own forged
``run_created`` is refused. The canary run hands the secrets out every way a tool can (printed,
returned, raised, logged, quoted by a verifier); afterwards no stream, bucket, blob or service log line
of the package's server holds a canary value.
"""

from __future__ import annotations

import uuid

import pytest
from nats.js.errors import NotFoundError

from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.access import PermissionDenied
from reel.shared.nats.client import ReelClient
from tests.integration.authserver import fails_fast
from tests.integration.scenarios import create_manual_run
from tests.security.conftest import SecurityLedger, Suite
from tests.support.canary import (
    KEY_ENV,
    canaries,
    canary_workflow,
    env_names,
    env_workflow,
    every_stored_byte,
    outputs,
)

pytestmark = pytest.mark.security


def _found(secrets: dict[str, str], text: str | bytes) -> list[str]:
    """The names of the secrets whose values occur in ``text``."""
    raw = text if isinstance(text, bytes) else text.encode()
    return [name for name, value in secrets.items() if value.encode() in raw]


async def test_a_command_step_printing_env_shows_no_nats_credentials_or_model_key(
        suite: Suite, client: ReelClient, security_ledger: SecurityLedger) -> None:
    started = await client.start(parse_workflow(env_workflow()))
    assert started.ok and started.run_id, started
    state = await client.wait_for(started.run_id, ("completed", "verifying"), timeout_s=60)
    out = await outputs(client, state)
    secret = canaries(suite.secrets) | {"REEL_NATS_USER": suite.secrets["REEL_NATS_USER"]}
    for what, text in (("a command step", out["env#1"]), ("an agent's command tool", out["solve:t1:c0#1"])):
        names = env_names(text)
        leaked = sorted({n for n in names if n.startswith("REEL_NATS_") or n == KEY_ENV} | set(_found(secret, text)))
        security_ledger.record(f"env printed by {what}", refused=not leaked, let_in=bool(leaked),
                               secrets_found=len(leaked))
        assert "PATH" in names and "REEL_RUN_ID" in names, text  # it did print its environment
        assert not leaked, f"{what} printed {leaked}"


async def test_a_client_cannot_publish_a_forged_run_created(
        suite: Suite, client: ReelClient, security_ledger: SecurityLedger) -> None:
    run_id = f"r-forged-{uuid.uuid4().hex[:8]}"
    n, op = suite.server.base.names, suite.server.operator
    exc = await fails_fast(create_manual_run(client.log, run_id, [("work", 1)]))
    try:
        await op.js.get_last_msg(n.events_stream, n.events(run_id))
        stored = True
    except NotFoundError:
        stored = False
    refused = isinstance(exc, PermissionDenied)
    security_ledger.record("forged run_created on the events stream", refused=refused, let_in=bool(stored))
    assert refused, exc
    assert not stored, "a forged run_created was stored"


async def test_canary_secrets_reach_no_stream_bucket_blob_or_log_line(
        suite: Suite, client: ReelClient, security_ledger: SecurityLedger) -> None:
    started = await client.start(parse_workflow(canary_workflow()))
    assert started.ok and started.run_id, started
    state = await client.wait_for(started.run_id, ("completed",), timeout_s=90)
    out = await outputs(client, state)
    stored, streams = await every_stored_byte(suite.server)
    logs = suite.logs.text()
    secret = canaries(suite.secrets)
    in_store, in_logs = _found(secret, stored), _found(secret, logs)
    security_ledger.record("canary grep of every stream, bucket and blob", refused=not in_store,
                           let_in=bool(in_store), secrets_found=len(in_store))
    security_ledger.record("canary grep of every service log line", refused=not in_logs,
                           let_in=bool(in_logs), secrets_found=len(in_logs))
    n = suite.server.base.names
    assert {n.events_stream, n.verdicts_stream, f"OBJ_{n.blob_bucket}", f"KV_{n.outcome_bucket}"} <= set(streams)
    assert not in_store, f"stored: {in_store}"
    assert not in_logs, f"logged: {in_logs}"
    # the tools did hand them out (this is a real attack): each is recorded as its marker
    assert out["passed#1"] == f"key [redacted:{KEY_ENV}]\n"
    assert "[redacted:REEL_NATS_PASSWORD]" in out["solve:t1:c0#1"]
    assert "tool.leaking" in logs and f"[redacted:{KEY_ENV}]" in logs
