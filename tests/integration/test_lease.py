"""An executor's lease on a real server: written before it is held, renewed while the loop runs, and lost for
good — never renewed late — once the renewals stop landing in time (a frozen or blocked process)."""

from __future__ import annotations

import asyncio
import time

import pytest

from reel.shared.core.errors import LeaseLost
from reel.shared.nats.infra import Infra
from reel.shared.nats.leases import Lease, executor_alive
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


async def test_a_stopping_holder_deletes_its_lease(infra: Infra) -> None:
    lease = Lease(infra.leases, "x-stopping", 2)
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    stop.set()
    await asyncio.wait_for(keeper, 5)
    assert not await executor_alive(infra.leases, "x-stopping")
