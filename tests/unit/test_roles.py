"""The permission matrix (shared/auth/roles.py): what no client may touch, who writes what, and docs/security.md
shows it.

The live proof — the same grants on a real server — is tests/integration/test_auth.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reel.shared.auth.authdir import render_auth_conf
from reel.shared.auth.roles import (
    API,
    CLIENT_COMMANDS,
    CLIENT_ROLES,
    ROLES,
    account_user_may_publish,
    client_grant,
    client_imports,
    grants,
    may_publish,
    render_matrix,
    streams,
)
from reel.shared.core.wire.subjects import COMMANDS, Names
from reel.shared.nats.access import connect_options, redact_url
from reel.shared.runtime.config import NatsAuth

REPO = Path(__file__).resolve().parents[2]
N = Names("reel")


def _writers(subject: str) -> set[str]:
    g = grants(N)
    out = {r for r in ROLES if r not in CLIENT_ROLES and may_publish(g[r], subject)}
    return out | {r for r in CLIENT_ROLES if account_user_may_publish(N, r, subject)}


@pytest.mark.parametrize("subject, writers", [
    ("reel.ev.r-1", {"executor", "verifier", "mutators", "operator"}),
    ("reel.verdict.r-1", {"verifier", "operator"}),
    ("$KV.reel_leases.e-1", {"executor", "operator"}),
    ("$KV.reel_outcomes.r.main.s.1", {"executor", "mutators", "operator"}),  # recovery claims a lost attempt's key
    ("$KV.reel_snapshots.r-1", {"executor", "operator"}),
    ("reel.cmd.start", {"client", "operator"}),
    ("reel.cmd.cancel", {"client", "operator"}),
    ("reel.cmd.rewind", {"client", "operator"}),
    ("reel.cmd.resume", {"mutators", "operator"}),
    ("reel.cmd.recover", {"operator"}),
    ("reel.cmd.verify.r-1", {"executor", "mutators", "operator"}),
    ("$JS.API.CONSUMER.MSG.NEXT.REEL_CMDS.reel_verifier", {"verifier", "operator"}),
    ("$JS.API.STREAM.MSG.GET.REEL_CMDS", {"mutators", "operator"}),
    ("reel.crucible.s-1", {"crucible", "operator"}),
    ("reel.ctl.r-1", {"mutators", "operator"}),  # the cancel service's signal to the executor
    ("reel.stream.r-1.main.solve:t1.1", {"executor", "operator"}),  # streamed tokens
    ("$O.reel_blobs.C.abc", {"client", "executor", "crucible", "operator"}),
    ("$O.reel_blobs.M.abc", {"client", "executor", "crucible", "retention", "operator"}),  # retention: delete markers
    ("$JS.API.STREAM.CREATE.REEL_EVENTS", {"executor", "verifier", "mutators", "crucible", "retention", "operator"}),
    ("$JS.API.STREAM.UPDATE.REEL_EVENTS", {"operator"}),
    ("$JS.API.STREAM.DELETE.REEL_EVENTS", {"operator"}),
    ("$JS.API.STREAM.PURGE.REEL_EVENTS", {"retention", "operator"}),  # retention drops runs
    ("$JS.API.STREAM.MSG.DELETE.REEL_EVENTS", {"operator"}),
    ("$JS.API.STREAM.PURGE.OBJ_reel_blobs", {"retention", "operator"}),  # its filter is in its body: the collector only
    ("$JS.API.CONSUMER.DELETE.REEL_EVENTS.reel_verifier", {"verifier", "operator"}),  # its old durable
    ("$JS.API.CONSUMER.DELETE.REEL_CMDS.reel_executor", {"operator"}),
    ("$JS.API.CONSUMER.CREATE.REEL_EVENTS.reel_verifier", {"operator"}),
    ("$JS.API.CONSUMER.DURABLE.CREATE.REEL_CMDS.reel_executor", {"executor", "operator"}),
    ("$JS.API.CONSUMER.MSG.NEXT.REEL_CMDS.reel_executor", {"executor", "operator"}),
    ("$JS.ACK.REEL_CMDS.reel_cancel.1.2.3.4.5", {"mutators", "operator"}),
    ("$JS.API.CONSUMER.CREATE.REEL_VERDICTS", {"mutators", "operator"}),  # the consumer gate's forward
    ("reel.gate.consumer.REEL_VERDICTS", {"client", "viewer", "operator"}),  # a client's request, to the gate
    ("reel.gate.consumer.REEL_CMDS", {"operator"}),
    ("$JS.API.CONSUMER.CREATE.REEL_EVENTS.x", {"operator"}),
    ("$JS.API.CONSUMER.CREATE.REEL_EVENTS.x.reel.ev.r-1", {"operator"}),
    ("$JS.API.CONSUMER.DURABLE.CREATE.REEL_EVENTS.x", {"operator"}),
    ("$JS.API.DIRECT.GET.REEL_EVENTS", {"client", "viewer", "executor", "verifier", "mutators", "retention",
                                        "operator"}),
    ("$SRV.PING", {"client", "viewer", "operator"}),  # discovery (the services answer it)
    ("$SRV.INFO.reel-executor", {"client", "viewer", "operator"}),
])
def test_who_may_publish_each_subject(subject: str, writers: set[str]) -> None:
    assert _writers(subject) == writers


def test_every_command_subject_has_a_publisher_and_a_consumer() -> None:
    g = grants(N)
    for name in (*COMMANDS, "crucible.run", "crucible.resume", "verify.r-1"):
        subject = N.command(name)
        assert _writers(subject) - {"operator"} or name == "recover", name
    consumers = {r for r in ROLES for p in g[r].publish if p.startswith(f"{API}.CONSUMER.MSG.NEXT.{N.commands_stream}")}
    assert consumers == {"executor", "verifier", "mutators", "crucible"}
    assert set(CLIENT_COMMANDS) <= {*COMMANDS, "crucible.run", "crucible.resume"}


def test_the_client_account_imports_nothing_that_writes_history_or_administers() -> None:
    for i in client_imports(N):
        for forbidden in ("reel.ev.", "reel.verdict.", "$KV.", "reel.cmd.resume", "reel.cmd.recover",
                          f"{API}.STREAM.CREATE", f"{API}.STREAM.UPDATE", f"{API}.STREAM.DELETE",
                          f"{API}.STREAM.PURGE", f"{API}.STREAM.MSG.DELETE", f"{API}.CONSUMER.DELETE",
                          f"{API}.CONSUMER.DURABLE", f"{API}.CONSUMER.MSG.NEXT", "$JS.ACK."):
            assert not i.subject.startswith(forbidden), i
        assert not i.subject.startswith(f"{API}.CONSUMER.CREATE.{N.commands_stream}"), i
    assert client_grant(N).subscribe == ("_INBOX.>", "reel.stream.>")  # replies, and streamed tokens (read only)


def test_the_names_follow_the_namespace() -> None:
    acme = Names("acme")
    assert all(x.startswith(("ACME_", "OBJ_acme_", "KV_acme_")) for x in streams(acme).values())
    for role, g in grants(acme).items():
        if role != "operator":
            assert not any(".reel." in p or p.startswith("reel.") or "REEL_" in p for p in g.publish), role
    conf = render_auth_conf(acme, dict.fromkeys(ROLES, "$2a$04$x"))
    assert "ACME_CLIENTS" in conf and "JS.ACME.API.STREAM.INFO.ACME_EVENTS" in conf


def test_docs_security_shows_the_matrix() -> None:
    doc = (REPO / "docs" / "security.md").read_text()
    assert render_matrix(N) in doc, "docs/security.md's matrix is stale: paste render_matrix(Names())"


def test_connect_options_and_redaction_keep_secrets_out_of_reprs_and_urls(tmp_path: Path) -> None:
    auth = NatsAuth(user="executor", password="s3cret-pw", nkey_seed="SUAB", inbox_prefix="_INBOX_executor")
    assert "s3cret-pw" not in repr(auth) and "SUAB" not in repr(auth)
    opts = connect_options(auth)
    assert opts["user"] == "executor" and opts["password"] == "s3cret-pw" and opts["nkeys_seed_str"] == "SUAB"
    assert opts["inbox_prefix"] == "_INBOX_executor"
    assert redact_url("nats://u:pw@h:4222,nats://h2:4222") == "nats://***@h:4222,nats://h2:4222"
    pw = tmp_path / "pw"
    pw.write_text("from-a-file\n")
    assert NatsAuth.from_env({"REEL_NATS_USER": "c", "REEL_NATS_PASSWORD_FILE": str(pw)}).password == "from-a-file"
    assert not NatsAuth.from_env({}).configured


def test_service_flags_set_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from reel.services.runtime.runner import apply_connection_flags

    monkeypatch.setenv("REEL_NATS_USER", "")  # restored (removed) after the test
    monkeypatch.setenv("REEL_NATS_TLS_CA", "")
    apply_connection_flags(["--nats-user", "executor", "serve", "executor", "--nats-tls-ca=/ca.pem"])
    assert os.environ["REEL_NATS_USER"] == "executor" and os.environ["REEL_NATS_TLS_CA"] == "/ca.pem"


def test_a_viewer_reads_what_a_client_reads_and_sends_no_command() -> None:
    for name in (*CLIENT_COMMANDS, "recover", "resume"):
        assert not account_user_may_publish(N, "viewer", N.command(name)), name
    assert not account_user_may_publish(N, "viewer", "$O.reel_blobs.C.abc")
    assert not account_user_may_publish(N, "viewer", "reel.cmd.run.r-1.start")
    readable = [i.subject for i in client_imports(N) if not i.subject.startswith(("reel.cmd.", "$O."))]
    assert readable and all(account_user_may_publish(N, "viewer", s) for s in readable)


def test_clients_may_not_name_a_consumer_or_make_it_durable() -> None:
    """Only the bare ``CONSUMER.CREATE.<stream>`` (to the gate) is a client's: a name, a filter in the subject
    or the legacy durable subject is denied whatever an import would allow."""
    p = "JS.REEL.API"
    for role in CLIENT_ROLES:
        g = grants(N)[role]
        assert may_publish(g, f"{p}.CONSUMER.CREATE.REEL_EVENTS")
        for subject in (f"{p}.CONSUMER.CREATE.REEL_EVENTS.x", f"{p}.CONSUMER.CREATE.REEL_EVENTS.x.reel.ev.r",
                        f"{p}.CONSUMER.DURABLE.CREATE.REEL_EVENTS.x", f"{p}.CONSUMER.CREATE.REEL_CMDS"):
            assert not may_publish(g, subject), (role, subject)


def test_redact_url_never_raises_and_hides_credentials_of_a_url_that_does_not_parse() -> None:
    assert redact_url("nats://u:secret@[::1") == "nats://***@[::1"
    assert redact_url("nats://u:secret@host:99999,nats://ok:4222") == "nats://***@host:99999,nats://ok:4222"
    assert redact_url("nats://[::1") == "nats://[::1"
