"""The health signal of a service process, and its probe: ``python -m reel.services.runtime.health [SERVICE] [--live]``.

A service started by :func:`reel.services.runtime.runner.run_service` with ``$REEL_HEARTBEAT_FILE``
set (the image sets it) touches that file every :data:`HEARTBEAT_EVERY_S` seconds
from its event loop while it serves (:func:`heartbeat`). The probe answers one of
two questions, exit code 0 (yes) or 1 (no), with one line saying why:

* ``--live`` — *is the process's event loop alive?* The heartbeat file is at most
  ``--max-age-s`` (default 30) seconds old. Reads one file, imports nothing but the
  standard library (≈ 30 ms): the Docker ``HEALTHCHECK``, the Kubernetes startup and
  liveness probes. It needs no NATS, so a NATS outage does not make a live service
  look dead (the service reconnects by itself).
* without ``--live`` — *is it ready?* Connects to NATS as the service does
  (``$NATS_URL``, ``$REEL_NAMESPACE``), checks JetStream answers and, with ``SERVICE``,
  that the service's durable consumer exists on its stream (the events stream for the
  verifier, the commands stream for the others), all within ``--timeout-s`` (default 5):
  compose's ``healthcheck`` (which ``depends_on`` waits for) and the Kubernetes readiness probe.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reel.shared.runtime.config import Config

HEARTBEAT_ENV = "REEL_HEARTBEAT_FILE"
"""The environment variable naming the heartbeat file (no heartbeat when unset)."""
HEARTBEAT_EVERY_S = 5.0
"""Seconds between two touches of the heartbeat file."""


class Unhealthy(Exception):
    """The probe's answer is no; the message says why (one line)."""


async def heartbeat(path: Path, every_s: float = HEARTBEAT_EVERY_S) -> None:
    """Touch ``path`` now and every ``every_s`` seconds until cancelled (creates its directory).

    A file that cannot be written is logged once and the beat stops (the liveness probe then fails).
    """
    import asyncio  # here, not at the top: the --live probe imports nothing but what it needs

    import structlog

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            path.touch()  # noqa: ASYNC240 - one syscall, on the loop on purpose: it proves the loop runs
            await asyncio.sleep(every_s)
    except OSError as exc:
        structlog.get_logger("reel.health").error("service.heartbeat_failed", path=str(path), error=str(exc))


def live(path: Path, max_age_s: float, now: float | None = None) -> str:
    """``ok: …`` if the heartbeat file ``path`` was touched at most ``max_age_s`` seconds ago (wall clock).

    Raises:
        Unhealthy: no such file (not serving yet), or it is older than ``max_age_s``.
    """
    try:
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except FileNotFoundError:
        raise Unhealthy(f"no heartbeat at {path}: the service is not serving yet") from None
    if age > max_age_s:
        raise Unhealthy(f"heartbeat {path} is {age:.0f} s old (> {max_age_s:g} s): the event loop is stuck")
    return f"ok: heartbeat {age:.1f} s old"


async def ready(cfg: Config, service: str | None) -> str:
    """``ok: …`` if NATS and JetStream answer and (with ``service``) its durable consumer exists.

    Raises:
        Unhealthy: NATS does not answer, JetStream is unavailable, or the consumer does not exist.
    """
    from reel.shared.nats.infra import connect

    try:
        nc = await connect(cfg, name="reel-health")
    except Exception as exc:
        raise Unhealthy(f"cannot reach NATS at {cfg.nats_url}: {exc}") from exc
    try:
        js = nc.jetstream()
        try:
            await js.account_info()
        except Exception as exc:
            raise Unhealthy(f"JetStream is not available at {cfg.nats_url}: {exc}") from exc
        if service is None:
            return f"ok: NATS and JetStream at {cfg.nats_url}"
        names = cfg.names
        stream = names.commands_stream  # every service's durable consumer reads it (the verifier: its triggers)
        durable = names.consumer(service)
        try:
            await js.consumer_info(stream, durable)
        except Exception as exc:
            raise Unhealthy(f"{service} is not consuming: no consumer {durable} on {stream} ({exc})") from exc
        return f"ok: {service} consumer {durable} on {stream}"
    finally:
        await nc.close()


def probe(args: argparse.Namespace) -> str:
    """Run the check ``args`` asks for; returns the ``ok`` line.

    Raises:
        Unhealthy: the answer is no.
    """
    if args.live:
        beat = os.environ.get(HEARTBEAT_ENV)
        if not beat:
            raise Unhealthy(f"${HEARTBEAT_ENV} is not set: this service writes no heartbeat")
        return live(Path(beat), args.max_age_s)
    import asyncio
    import logging

    from reel.shared.runtime.config import Config

    cfg = Config.from_env()
    logging.getLogger("nats.aio.client").setLevel(logging.CRITICAL)  # its reconnect tracebacks: one line is ours
    try:
        return asyncio.run(asyncio.wait_for(ready(cfg, args.service), args.timeout_s))
    except TimeoutError:
        raise Unhealthy(f"no answer from NATS at {cfg.nats_url} within {args.timeout_s:g} s") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m reel.services.runtime.health``: print one line; 0 healthy, 1 not, 2 bad arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m reel.services.runtime.health", description=__doc__.split("\n\n")[0])
    parser.add_argument("service", nargs="?", help="check this service's consumer too (executor, verifier, …)")
    parser.add_argument("--live", action="store_true", help="liveness only: the heartbeat file is fresh (no NATS)")
    parser.add_argument("--max-age-s", type=float, default=30.0, help="--live: the oldest heartbeat that is alive")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="readiness: give up after this long")
    try:
        print(probe(parser.parse_args(argv)))
    except Unhealthy as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
