"""An executor's lease on a real server: written before it is held, renewed while the loop runs, and lost for
good — never renewed late — once the renewals stop landing in time (a frozen or blocked process)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import pytest

from reel.shared.core.errors import LeaseLost
from reel.shared.nats.infra import Infra
from reel.shared.nats.leases import Lease, executor_alive
from reel.shared.runtime.config import Config
from tests.integration.scenarios import wait_until


async def _true(value: bool) -> bool:
    return value


async def test_acquire_makes_the_lease_visible_before_it_returns(infra: Infra) -> None:
    lease = Lease(infra.leases, "x-acquire", 2)
    assert not lease.held() and not await executor_alive(infra.leases, "x-acquire")
    with pytest.raises(LeaseLost):
        lease.check()  # not acquired yet: nothing may be written
    assert not lease.lost.is_set(), "a lease not yet acquired is not lost"
    assert await lease.acquire(asyncio.Event())
    assert lease.held() and await executor_alive(infra.leases, "x-acquire")
    lease.check()  # held: no raise


async def test_a_loop_blocked_past_the_lease_loses_it_for_good(infra: Infra) -> None:
    lost_calls: list[float] = []
    lease = Lease(infra.leases, "x-blocked", 1, on_lost=lambda: lost_calls.append(time.monotonic()))
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    first = lease.valid_until
    await wait_until(lambda: _true(lease.valid_until > first), timeout_s=5, what="a renewal to land")
    assert lease.held()
    time.sleep(1.2)  # noqa: ASYNC251 -- the point: the whole loop blocked (as SIGSTOP freezes it) past ttl - margin
    with pytest.raises(LeaseLost, match="lost its lease"):
        lease.check()
    assert len(lost_calls) == 1 and lease.lost.is_set()
    await asyncio.wait_for(keeper, 5)  # the keeper ends by itself: it never renews a lost lease
    with pytest.raises(LeaseLost):
        lease.check()
    assert len(lost_calls) == 1, "on_lost runs once"
    deadline = time.monotonic() + 10
    while await executor_alive(infra.leases, "x-blocked"):  # not renewed: the server lets it expire
        assert time.monotonic() < deadline, "the lost lease was renewed"
        await asyncio.sleep(0.2)


async def test_a_loop_slowed_by_busy_callbacks_keeps_the_lease(infra: Infra) -> None:
    """Each turn of the loop runs a 0.35 s callback (many runs' work between two reads of the socket): a KV put
    takes about seven turns, ≈ 2.5 s, more than a beat (ttl / 3 = 2 s) but within two, and the lease stays held
    (it was lost when each renewal's answer had to be read within one beat)."""
    lease = Lease(infra.leases, "x-busy", 6)
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    end = time.monotonic() + 15
    while time.monotonic() < end:
        time.sleep(0.35)  # noqa: ASYNC251 -- the point: a callback that holds the loop, as a burst of runs does
        await asyncio.sleep(0)
        assert lease.held(), "the lease was lost while the loop kept turning"
    assert not lease.lost.is_set()
    stop.set()
    await asyncio.wait_for(keeper, 5)


async def test_a_stopping_holder_deletes_its_lease(infra: Infra) -> None:
    lease = Lease(infra.leases, "x-stopping", 2)
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    stop.set()
    await asyncio.wait_for(keeper, 5)
    assert not await executor_alive(infra.leases, "x-stopping")


async def test_a_consumer_that_raises_stops_the_executor_and_its_lease(
        infra: Infra, cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor's consumers and its lease run in one task group: a consumer that raises ends ``serve`` with
    its error, and the lease is renewed no more (recovery must not believe a dead executor alive)."""
    from reel.services.executor import app
    from reel.shared.nats import consumer

    consuming, fail = asyncio.Event(), asyncio.Event()

    async def broken(self: consumer.CommandConsumer, stop: asyncio.Event) -> None:  # fault injected in Reel's code
        consuming.set()
        await fail.wait()
        raise RuntimeError("the consumer broke")

    monkeypatch.setattr(consumer.CommandConsumer, "run", broken)
    stop = asyncio.Event()
    served = asyncio.create_task(app.serve(infra, cfg, stop, executor_id="x-broken-consumer"))
    try:
        await asyncio.wait_for(consuming.wait(), 30)
        assert await executor_alive(infra.leases, "x-broken-consumer")
        fail.set()
        raised: list[BaseException] = []
        try:
            await asyncio.wait_for(asyncio.shield(served), 10)
        except* RuntimeError as group:  # within the consumers' own task group
            raised += group.exceptions
        assert [str(e) for e in raised] == ["the consumer broke"]
        ended = time.monotonic()
        await wait_until(lambda: _not(executor_alive(infra.leases, "x-broken-consumer")),
                         timeout_s=cfg.lease_ttl_s * 3, what="the lease to expire, unrenewed")
        assert time.monotonic() - ended <= cfg.lease_ttl_s * 2
    finally:
        stop.set()
        if not served.done():
            served.cancel()
        await asyncio.gather(served, return_exceptions=True)


async def _not(alive: Awaitable[bool]) -> bool:
    return not await alive
