"""Which command partitions an executor consumes: its own, plus any no live executor owns (adopted).

With ``REEL_PARTITIONS`` N ≥ 1 the commands stream stores a keyed start/resume of run R under
partition ``p = partition(N, R)`` (shared/core/wire/subjects.py), and partition p has one durable consumer,
``<ns>_executor_p<p>``. An executor consumes:

* the shared durable ``<ns>_executor`` on the plain ``<ns>.cmd.start`` / ``<ns>.cmd.resume`` (any client
  that does not key its commands; every executor takes part);
* the durables of its own partitions (``REEL_EXECUTOR_PARTITIONS``, default all N), named in its lease;
* the durable of any partition no live lease names for at least one lease TTL (its owner died or was
  never started): adopted, and released (drained: runs in flight finish) once a live lease names it again.

All of them draw on one limit, ``REEL_MAX_CONCURRENT_RUNS`` (default 256 for an executor:
:data:`~reel.shared.runtime.config.DEFAULT_EXECUTOR_RUNS`): the runs the executor drives at once.

Ownership is affinity, never correctness: every commit is fenced (shared/application/fenced.py), so two executors on
one partition durable only share its messages. A dead owner's un-acked commands are redelivered after
the ack wait to whoever binds the durable then (docs/architecture.md, "Executor partitions").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable

import structlog
from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue

from reel.shared.nats.consumer import CommandConsumer, Handler, Slots
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config

log = structlog.get_logger("reel.executor")


def own_partitions(cfg: Config) -> tuple[int, ...]:
    """This executor's own partitions: ``cfg.executor_partitions`` (those below N), default all N."""
    n = cfg.names.partitions
    if n < 1:
        return ()
    chosen = range(n) if cfg.executor_partitions is None else cfg.executor_partitions
    return tuple(p for p in chosen if 0 <= p < n)


async def owned_by_live_leases(leases: KeyValue, exclude: str) -> set[int]:
    """The partitions named by every live executor lease but ``exclude``'s (an unreadable entry names none)."""
    try:
        keys = await leases.keys()
    except NoKeysError:
        return set()
    out: set[int] = set()
    for key in keys:
        if key == exclude:
            continue
        with contextlib.suppress(Exception):
            entry = await leases.get(key)
            if entry.value:
                out.update(int(p) for p in json.loads(entry.value).get("partitions", ()))
    return out


class PartitionConsumers:
    """The command consumers of one executor (see the module doc); :meth:`run` until ``stop``.

    Args:
        handler: the executor's command handler (its Router).
        plain_subjects: the shared durable's filter (the plain start/resume subjects).
        check_s: how often the leases are read for orphaned partitions (seconds; default lease TTL / 2).
    """

    def __init__(self, infra: Infra, cfg: Config, executor_id: str, handler: Handler,
                 plain_subjects: Iterable[str], *, check_s: float | None = None) -> None:
        self.infra, self.cfg, self.executor_id, self.handler = infra, cfg, executor_id, handler
        self.plain_subjects = list(plain_subjects)
        self.own = own_partitions(cfg)
        self.check_s = check_s if check_s is not None else max(0.2, cfg.lease_ttl_s / 2)
        self.adopted: dict[int, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        self._uncovered_since: dict[int, float] = {}
        self._released: set[asyncio.Task[None]] = set()  # adopted consumers draining after their release
        self.slots = Slots(cfg.executor_max_runs)  # one limit for the executor, across all its durables
        self._group: asyncio.TaskGroup | None = None  # the consumers' task group while :meth:`run` runs

    def _consumer(self, service: str, subjects: list[str]) -> CommandConsumer:
        return CommandConsumer(self.infra, self.cfg, service, subjects, self.handler,
                               ack_wait_s=self.cfg.command_ack_wait_s, instance_id=self.executor_id,
                               slots=self.slots)

    def _partition_consumer(self, p: int) -> CommandConsumer:
        names = self.cfg.names
        return self._consumer(names.partition_consumer(p), [names.partition(p)])

    async def run(self, stop: asyncio.Event) -> None:
        """Consume the shared durable, the own partitions and adopted ones until ``stop``; then drain all."""
        try:
            async with asyncio.TaskGroup() as tg:  # one consumer that raises stops the others (and the service)
                self._group = tg  # adopted consumers join it: cancelled (a lost lease), they stop fetching at once
                tg.create_task(self._consumer("executor", self.plain_subjects).run(stop))
                for p in self.own:
                    tg.create_task(self._partition_consumer(p).run(stop))
                if len(self.own) < self.cfg.names.partitions:
                    tg.create_task(self._watch(stop))
        finally:
            self._group = None
            for ev, _ in self.adopted.values():
                ev.set()
            await asyncio.gather(*(t for _, t in self.adopted.values()), *self._released, return_exceptions=True)

    async def _watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.check(await owned_by_live_leases(self.infra.leases, self.executor_id))
            except Exception as exc:  # the leases could not be read: keep what we consume
                log.warning("partitions.leases_unreadable", error=str(exc))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.check_s):
                    await stop.wait()
        for ev, _ in self.adopted.values():  # stopping: the adopted consumers drain with the rest
            ev.set()

    async def check(self, owned_elsewhere: set[int]) -> None:
        """Adopt every partition not our own that no live lease has named for one lease TTL; release an
        adopted one a live lease names again (its consumer drains: commands in flight finish here)."""
        now = time.monotonic()
        for p in range(self.cfg.names.partitions):
            if p in self.own:
                continue
            if p in owned_elsewhere:
                self._uncovered_since.pop(p, None)
                if p in self.adopted:
                    ev, task = self.adopted.pop(p)
                    ev.set()
                    self._released.add(task)
                    task.add_done_callback(self._released.discard)
                    log.info("partition.released", partition=p)
                continue
            since = self._uncovered_since.setdefault(p, now)
            if p not in self.adopted and now - since >= self.cfg.lease_ttl_s:
                ev = asyncio.Event()
                spawn = self._group.create_task if self._group is not None else asyncio.create_task
                self.adopted[p] = (ev, spawn(self._partition_consumer(p).run(ev)))
                log.info("partition.adopted", partition=p)
