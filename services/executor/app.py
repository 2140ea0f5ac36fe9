"""Executor service wiring: turns start/resume commands into runs and drives them to ``Verifying``.

``serve()`` constructs the ports (event log, blob store) once, hands them to the
:class:`~services.executor.handler.Executor` (commands, services/executor/handler.py),
which drives runs (services/executor/driver.py) attempt by attempt
(services/executor/attempts.py), consumes the start/resume command subjects (the shared durable,
and with ``REEL_PARTITIONS`` its own and orphaned partitions: services/executor/partitions.py), and
keeps this executor's lease alive (shared/nats/leases.py, naming its partitions) until the drain is over, and
resolves its own attempts a drive that raised left open once they are settled (services/executor/orphans.py).

Shutdown (``stop`` set, e.g. SIGTERM): no new command is taken; the attempts in flight run on
for ``cfg.drain_deadline_s`` (``REEL_DRAIN_DEADLINE_S``, default 45 s, inside the deployments'
60 s grace), then they are interrupted and recorded ``interrupted`` (retryable, not a try), and
the runs are handed back to another executor (services/executor/interrupts.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from shared.config import Config
from shared.nats.blobstore import JetStreamBlobStore
from shared.nats.eventlog import JetStreamEventLog
from shared.nats.infra import Infra
from shared.nats.leases import heartbeat
from shared.proc.tools import reap_orphaned_tools

from .handler import Executor
from .partitions import PartitionConsumers

log = structlog.get_logger("reel.executor")


def ports(infra: Infra, cfg: Config) -> tuple[JetStreamEventLog, JetStreamBlobStore]:
    """The executor's ports on ``infra``: the event log and the blob store."""
    return JetStreamEventLog(infra.nc, cfg.names), JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, **kwargs: Any) -> None:
    """Run one executor instance until ``stop`` is set (``kwargs``: see :class:`Executor`)."""
    ex = Executor(infra, cfg, *ports(infra, cfg), stopping=stop, **kwargs)
    structlog.contextvars.bind_contextvars(executor_id=ex.executor_id)
    reaped = await asyncio.to_thread(reap_orphaned_tools)
    if reaped:
        log.warning("executor.reaped_orphaned_tools", process_groups=reaped)
    consumers = PartitionConsumers(infra, cfg, ex.executor_id, ex.router, ex.router.subjects)
    lease_stop = asyncio.Event()  # the lease outlives the drain: in-flight attempts are still ours
    hb = asyncio.create_task(heartbeat(infra.leases, ex.executor_id, cfg.lease_ttl_s, lease_stop, consumers.own))
    deadline = asyncio.create_task(_drain_deadline(ex, stop, cfg.drain_deadline_s))
    orphans = asyncio.create_task(ex.orphans.tend_loop(lambda: ex.driving, stop, cfg.lease_ttl_s))
    try:
        await ex.control.start()
        await consumers.run(stop)
    finally:
        deadline.cancel()
        await orphans
        lease_stop.set()
        await hb
        await ex.control.stop()


async def _drain_deadline(ex: Executor, stop: asyncio.Event, deadline_s: float) -> None:
    """Once ``stop`` is set, wait ``deadline_s``; then interrupt every attempt still in flight."""
    await stop.wait()
    await asyncio.sleep(deadline_s)
    log.warning("executor.drain_deadline", deadline_s=deadline_s)
    ex.control.shutdown()
