"""Executor service wiring: turns start/resume commands into runs and drives them to ``Verifying``.

``serve()`` constructs the ports (event log, blob store) once, hands them to the
:class:`~reel.services.executor.handler.Executor` (commands, services/executor/handler.py),
which drives runs (services/executor/driver.py) attempt by attempt
(services/executor/attempts.py), consumes the start/resume command subjects (the shared durable,
and with ``REEL_PARTITIONS`` its own and orphaned partitions: services/executor/partitions.py), and
keeps this executor's lease (shared/nats/leases.py, naming its partitions: written before the first command,
renewed from a thread of its own with its own connection — a stalled event loop does not delay it — until the
drain is over), and resolves its own attempts a drive that raised left open once they are
settled (services/executor/orphans.py). The tasks run in one task group: one that raises stops the service.

Shutdown (``stop`` set, e.g. SIGTERM): no new command is taken; the attempts in flight run on
for ``cfg.drain_deadline_s`` (``REEL_DRAIN_DEADLINE_S``, default 45 s, inside the deployments'
60 s grace), then they are interrupted and recorded ``interrupted`` (retryable, not a try), and
the runs are handed back to another executor (services/executor/interrupts.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from typing import Any

import structlog

from reel.shared.core.errors import LeaseLost
from reel.shared.core.run.ids import new_executor_id
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra, connect
from reel.shared.nats.leases import Lease
from reel.shared.proc.group import kill_groups, tracked_groups
from reel.shared.proc.tools import reap_orphaned_tools
from reel.shared.runtime.config import Config

from .handler import Executor
from .partitions import PartitionConsumers, own_partitions

log = structlog.get_logger("reel.executor")


def ports(infra: Infra, cfg: Config) -> tuple[JetStreamEventLog, JetStreamBlobStore]:
    """The executor's ports on ``infra``: the event log and the blob store."""
    return JetStreamEventLog(infra.nc, cfg.names), JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket,
                                                                             purge=not cfg.auth.configured)


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, *, interrupt_now: asyncio.Event | None = None,
                **kwargs: Any) -> None:
    """Run one executor until ``stop`` is set (``kwargs``: see :class:`Executor`). ``interrupt_now``, once set
    after ``stop``: the drain deadline is now — the attempts in flight are interrupted and recorded
    ``interrupted`` at once (``reel run``'s own executor on Ctrl-C).

    Each *incarnation* has its own executor id and lease (:class:`~reel.shared.nats.leases.Lease`): the lease is
    written and acknowledged before any command is taken. If the lease is lost (not renewed in time: a
    freeze, a lost server), the tools the incarnation started are killed at once, it writes nothing more
    (every commit, marker, trigger and snapshot checks the lease first), its consumers and drives stop, and
    a new incarnation starts under a new executor id; the old id's runs are taken over once its lease has
    expired on the server, and recovery resolves its open intents.
    """
    while True:
        try:
            await _incarnation(infra, cfg, stop, interrupt_now, **kwargs)
            return
        except LeaseLost:
            if stop.is_set():
                return
            kwargs = {k: v for k, v in kwargs.items() if k != "executor_id"}
            log.warning("executor.new_incarnation", reason="lease lost")


async def _incarnation(infra: Infra, cfg: Config, stop: asyncio.Event, interrupt_now: asyncio.Event | None,
                       **kwargs: Any) -> None:
    """One executor id's life (see :func:`serve`).

    Raises:
        LeaseLost: its lease was lost.
        Exception: what a consumer or a task of the incarnation raised (the others were stopped first).
    """
    executor_id = kwargs.pop("executor_id", None) or new_executor_id()
    await asyncio.to_thread(importlib.import_module, "reel.shared.models.openai")  # ≈1 s: never on the loop, mid-lease
    with tracked_groups() as groups:  # every tool process group this incarnation starts
        served = kwargs.get("tools")
        lease = Lease(infra.leases, executor_id, cfg.lease_ttl_s, connect=lambda: connect(cfg, name="reel-lease"),
                      partitions=own_partitions(cfg),
                      tools=None if served is None else served.keys,
                      on_lost=lambda: log.error("executor.lease_lost_tools_killed", process_groups=kill_groups(groups)))
        ex = Executor(infra, cfg, *ports(infra, cfg), stopping=stop, executor_id=executor_id, lease=lease, **kwargs)
        lease.waiting = ex.waiting_for
        structlog.contextvars.bind_contextvars(executor_id=ex.executor_id)
        if not await lease.acquire(stop):  # never a command before the lease is visible
            return
        reaped = await asyncio.to_thread(reap_orphaned_tools)
        if reaped:
            log.warning("executor.reaped_orphaned_tools", process_groups=reaped)
        consumers = PartitionConsumers(infra, cfg, ex.executor_id, ex.router, ex.router.subjects)
        lease_stop = asyncio.Event()  # the lease outlives the drain: in-flight attempts are still ours
        try:
            async with asyncio.TaskGroup() as tg:  # a task that raises stops the others, and the lease with them
                tg.create_task(lease.keep(lease_stop))
                tg.create_task(_fail_when_lost(lease, lease_stop))
                deadline = tg.create_task(_drain_deadline(ex, stop, cfg.drain_deadline_s, interrupt_now))
                orphans = tg.create_task(ex.orphans.tend_loop(lambda: ex.driving, stop, cfg.lease_ttl_s))
                await ex.control.start()
                taking = asyncio.Event()  # no command is taken once stopping or once the lease is lost
                tg.create_task(_set_when_first(taking, stop, lease.lost))
                await consumers.run(taking)
                deadline.cancel()
                await orphans
                lease_stop.set()
        except BaseExceptionGroup as group:
            lost = group.subgroup(LeaseLost)
            if lost is not None:
                raise lost.exceptions[0] from None
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            await ex.control.stop()
            if "reel.services.executor.mcptools" in sys.modules:  # its MCP servers (stdio: killed) go with it
                await sys.modules["reel.services.executor.mcptools"].close_servers()


async def _fail_when_lost(lease: Lease, done: asyncio.Event) -> None:
    """Raise :class:`LeaseLost` once ``lease`` is lost (before ``done``): the task group stops the incarnation."""
    lost, ended = asyncio.ensure_future(lease.lost.wait()), asyncio.ensure_future(done.wait())
    try:
        await asyncio.wait((lost, ended), return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
        ended.cancel()
    if lease.lost.is_set() and not done.is_set():
        lease.check()


async def _set_when_first(event: asyncio.Event, *causes: asyncio.Event) -> None:
    """Set ``event`` as soon as one of ``causes`` is set."""
    waits = [asyncio.ensure_future(cause.wait()) for cause in causes]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    event.set()


async def _drain_deadline(ex: Executor, stop: asyncio.Event, deadline_s: float,
                          now: asyncio.Event | None = None) -> None:
    """Once ``stop`` is set, wait ``deadline_s`` (or until ``now`` is set); then interrupt every attempt still in
    flight."""
    await stop.wait()
    if now is None:
        await asyncio.sleep(deadline_s)
    else:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(now.wait(), deadline_s)
    log.warning("executor.drain_deadline", deadline_s=deadline_s, at_once=now is not None and now.is_set())
    ex.control.shutdown()
