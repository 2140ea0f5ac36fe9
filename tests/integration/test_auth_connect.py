"""``connect()``'s credentials and TLS (shared/nats/access.py) against real servers: mutual TLS, nkey seeds,
and refusals that are one clear error at once, never a retry loop."""

from __future__ import annotations

import os
from pathlib import Path

import nkeys
import pytest
import trustme
from nats.aio.msg import Msg

from reel.shared.nats.access import ConnectRefused
from reel.shared.nats.embedded import embedded_server
from reel.shared.nats.infra import connect
from reel.shared.runtime.config import Config, NatsAuth
from tests.integration.authserver import fails_fast


async def _round_trip(cfg: Config) -> None:
    nc = await connect(cfg, name="reel-tests-tls")
    try:
        async def pong(msg: Msg) -> None:
            await msg.respond(b"pong")

        sub = await nc.subscribe("t.echo", cb=pong)
        assert (await nc.request("t.echo", b"ping", timeout=5)).data == b"pong"
        await sub.unsubscribe()
    finally:
        await nc.close()


async def test_mutual_tls_with_a_password(tmp_path: Path) -> None:
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("reel-client@example")
    files = {}
    for name, blob in {"ca.pem": ca.cert_pem, "server.pem": server_cert.cert_chain_pems[0],
                       "server.key": server_cert.private_key_pem, "client.pem": client_cert.cert_chain_pems[0],
                       "client.key": client_cert.private_key_pem}.items():
        blob.write_to_path(str(tmp_path / name))
        files[name] = str(tmp_path / name)
    conf = tmp_path / "tls.conf"
    conf.write_text(f'tls {{ cert_file: "{files["server.pem"]}", key_file: "{files["server.key"]}", '
                    f'ca_file: "{files["ca.pem"]}", verify: true }}\n'
                    'authorization { users = [ {user: "client", password: "pw-tls-1"} ] }\n')
    async with embedded_server(config_file=str(conf)) as srv:
        good = NatsAuth(user="client", password="pw-tls-1", tls_ca=files["ca.pem"], tls_cert=files["client.pem"],
                        tls_key=files["client.key"])
        await _round_trip(Config(nats_url=srv.url, auth=good))
        no_ca = NatsAuth(user="client", password="pw-tls-1")  # the server's CA is not trusted
        exc = await fails_fast(connect(Config(nats_url=srv.url, auth=no_ca)), within_s=10)
        assert isinstance(exc, ConnectRefused) and "TLS" in exc.message, exc
        wrong = NatsAuth(user="client", password="nope-9", tls_ca=files["ca.pem"], tls_cert=files["client.pem"],
                         tls_key=files["client.key"])
        exc = await fails_fast(connect(Config(nats_url=srv.url, auth=wrong)), within_s=10)
        assert isinstance(exc, ConnectRefused) and "refused the login as NATS user 'client'" in exc.message, exc
        assert "nope-9" not in exc.message
    missing = NatsAuth(tls_ca=str(tmp_path / "absent.pem"))
    with pytest.raises(ConnectRefused, match=r"absent\.pem"):
        await connect(Config(nats_url="nats://127.0.0.1:1", auth=missing))


async def test_an_nkey_seed_as_text_or_file(tmp_path: Path) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    conf = tmp_path / "nkey.conf"
    conf.write_text(f'authorization {{ users = [ {{nkey: "{public}"}} ] }}\n')
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(seed)
    async with embedded_server(config_file=str(conf)) as srv:
        for value in (seed.decode(), str(seed_file)):
            await _round_trip(Config(nats_url=srv.url, auth=NatsAuth(nkey_seed=value)))
        exc = await fails_fast(connect(Config(nats_url=srv.url)), within_s=10)  # no credentials at all
        assert isinstance(exc, ConnectRefused) and "no credentials given" in exc.message, exc
