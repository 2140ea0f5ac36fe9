"""``python -m reel.services.executor``: run one executor instance (env: see shared/runtime/config.py)."""

import asyncio
import sys

from reel.services.runtime.runner import Stop, main_for
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config

from .app import serve


async def serve_process(infra: Infra, cfg: Config, stop: asyncio.Event) -> None:
    """:func:`serve`, then the process's model clients closed (their aiohttp sessions warn at exit otherwise). A
    second SIGTERM/SIGINT (:class:`Stop`) ends the drain at once: the attempts in flight are recorded
    ``interrupted``."""
    try:
        await serve(infra, cfg, stop, interrupt_now=stop.now if isinstance(stop, Stop) else None)
    finally:
        if "reel.shared.models.openai" in sys.modules:
            await sys.modules["reel.shared.models.openai"].CLIENTS.aclose()


if __name__ == "__main__":
    main_for("executor", serve_process)
