"""Process entry for every service: logging, signals, connect, ensure infra, serve, drain."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

import structlog

from shared.config import Config
from shared.logging import setup_logging
from shared.nats.infra import Infra, connect, ensure_infra

Serve = Callable[[Infra, Config, asyncio.Event], Awaitable[None]]


async def run_service(name: str, serve: Serve, cfg: Config) -> None:
    """Connect, create streams/buckets idempotently, serve until SIGTERM/SIGINT, then drain."""
    log = structlog.get_logger(f"reel.{name}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    nc = await connect(cfg, name=f"reel-{name}")
    try:
        infra = await ensure_infra(nc, cfg)
        log.info("service.started", nats_url=cfg.nats_url, namespace=cfg.names.namespace)
        await serve(infra, cfg, stop)
    finally:
        await nc.drain()
        log.info("service.stopped")


def main_for(name: str, serve: Serve) -> None:
    """``python -m services.<name>`` entry point."""
    setup_logging(name)
    asyncio.run(run_service(name, serve, Config.from_env()))
