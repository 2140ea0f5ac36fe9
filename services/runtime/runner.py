"""Process entry for every service: logging, signals (the first SIGTERM/SIGINT drains, a second stops at once:
:class:`Stop`), connect, ensure infra, serve, drain.

With ``$REEL_HEARTBEAT_FILE`` set (the image sets it), a service touches that file
from its event loop while it serves: the liveness signal ``python -m reel.services.runtime.health --live``
checks (:mod:`reel.services.runtime.health`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats.errors
import structlog

from reel.services.runtime.health import HEARTBEAT_ENV, heartbeat
from reel.shared.nats.access import redact_url
from reel.shared.nats.infra import Infra, connect, ensure_infra_retrying
from reel.shared.runtime.config import CONNECTION_FLAGS, Config
from reel.shared.runtime.deathsig import keep_environment_private
from reel.shared.runtime.logging import setup_logging
from reel.shared.runtime.metrics import serve_from_env as serve_metrics

Serve = Callable[[Infra, Config, asyncio.Event], Awaitable[None]]


class Stop(asyncio.Event):
    """A service process's stop: set by its first SIGTERM/SIGINT (stop taking work, let what is in flight
    finish); :attr:`now` set by the second (stop at once: the executor interrupts its attempts in flight and
    records them ``interrupted`` instead of waiting out its drain deadline)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = asyncio.Event()

    def signalled(self) -> None:
        """One SIGTERM/SIGINT: the first sets the stop, the next :attr:`now`."""
        (self.now if self.is_set() else self).set()


async def run_service(name: str, serve: Serve, cfg: Config) -> None:
    """Connect, create streams/buckets idempotently, serve until SIGTERM/SIGINT (a second one: at once, see
    :class:`Stop`), then drain."""
    log = structlog.get_logger(f"reel.{name}")
    stop = Stop()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.signalled)
    nc = await connect(cfg, name=f"reel-{name}")
    try:
        infra = await ensure_infra_retrying(nc, cfg)
        log.info("service.started", nats_url=redact_url(cfg.nats_url), namespace=cfg.names.namespace,
                 nats_user=cfg.auth.user)
        serve_metrics()  # REEL_METRICS_PORT: /metrics (shared/runtime/metrics.py)
        beat = os.environ.get(HEARTBEAT_ENV)
        beating = asyncio.create_task(heartbeat(Path(beat))) if beat else None
        try:
            await serve(infra, cfg, stop)
        finally:
            if beating is not None:
                beating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beating
    except nats.errors.Error as exc:  # e.g. ConnectionReconnectingError: the server went away as we stopped
        if not stop.is_set():
            raise
        log.warning("service.stop_unclean", error=type(exc).__name__)
    finally:
        if nc.is_connected:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await nc.drain()
        with contextlib.suppress(nats.errors.Error, OSError):  # the transport may be half gone already
            await nc.close()
        log.info("service.stopped")


def apply_connection_flags(argv: list[str]) -> None:
    """Set the environment variable of each connection flag in ``argv`` (reel.shared.runtime.config.CONNECTION_FLAGS;
    ``--nats-url`` sets ``NATS_URL``, ``--metrics-port`` ``REEL_METRICS_PORT``); other arguments are left alone."""
    parser = argparse.ArgumentParser(add_help=False)
    flags = {"--nats-url": ("NATS_URL", ""), "--metrics-port": ("REEL_METRICS_PORT", ""), **CONNECTION_FLAGS}
    for flag in flags:
        parser.add_argument(flag, dest=flag)
    known, _ = parser.parse_known_args(argv)
    for flag, (env, _help) in flags.items():
        value = getattr(known, flag)
        if value is not None:
            os.environ[env] = value


def main_for(name: str, serve: Serve) -> None:
    """``python -P -m reel.services.<name>`` entry point (connection flags: ``--nats-url``, ``--nats-user``, …)."""
    apply_connection_flags(sys.argv[1:])
    keep_environment_private()  # its tools cannot read its credentials back from /proc/$PPID/environ
    setup_logging(name, cache=True)  # a service never re-configures: loggers resolve once
    asyncio.run(run_service(name, serve, Config.from_env()))
