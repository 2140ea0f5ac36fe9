"""An executor's lease on a real server: written before it is held, renewed from its own thread whether or not
the event loop runs, and lost for good — never renewed late — once the renewals stop landing in time (a frozen
process, a wedged loop, an entry gone on the server)."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from reel.shared.core.errors import LeaseLost
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra, connect
from reel.shared.nats.leases import Lease, executor_alive
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import wait_until


async def _true(value: bool) -> bool:
    return value


def _lease(infra: Infra, cfg: Config, executor_id: str, ttl_s: float, **kwargs: Any) -> Lease:
    return Lease(infra.leases, executor_id, ttl_s, connect=lambda: connect(cfg, name="test-lease"), **kwargs)


async def test_acquire_makes_the_lease_visible_before_it_returns(infra: Infra, cfg: Config) -> None:
    lease = _lease(infra, cfg, "x-acquire", 2)
    assert not lease.held() and not await executor_alive(infra.leases, "x-acquire")
    with pytest.raises(LeaseLost):
        lease.check()  # not acquired yet: nothing may be written
    assert not lease.lost.is_set(), "a lease not yet acquired is not lost"
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    assert lease.held() and await executor_alive(infra.leases, "x-acquire")
    lease.check()  # held: no raise
    stop.set()
    await asyncio.wait_for(lease.keep(stop), 5)


def _block_loop(seconds: float) -> None:
    """A CPU-bound call on the event loop (as a heavy fold or a sync tool on the loop is): nothing else on the
    loop runs meanwhile, other threads still get the interpreter."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(10_000))


async def test_a_loop_blocked_past_the_lease_ttl_keeps_the_lease(infra: Infra, cfg: Config) -> None:
    """The renewals do not wait for the executor's loop: blocked for 1.5 TTLs, the lease stays held, and no
    renewal lands later than a beat (TTL / 3) after the one before, with slack for a loaded machine."""
    ttl = 2.0
    lease = _lease(infra, cfg, "x-blocked", ttl)
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    try:
        await wait_until(lambda: _true(len(lease.renewals) >= 2), timeout_s=5, what="a renewal to land")
        blocked = time.monotonic()
        _block_loop(ttl * 1.5)
        unblocked = time.monotonic()
        assert lease.held(), "the lease was lost while the loop was blocked"
        lease.check()
        assert await executor_alive(infra.leases, "x-blocked")
        during = [t for t in lease.renewals if blocked <= t <= unblocked]
        assert len(during) >= 3, f"renewals sent while the loop was blocked: {len(during)}"
        sent = [t for t in lease.renewals if t <= unblocked]
        gaps = [b - a for a, b in itertools.pairwise(sent)]
        assert max(gaps) < ttl / 3 + ttl / 4, f"a renewal came {max(gaps) - ttl / 3:.3f}s late"
    finally:
        stop.set()
        await asyncio.wait_for(keeper, 5)
    assert not lease.lost.is_set()
    assert not await executor_alive(infra.leases, "x-blocked"), "a stopping holder deletes its lease"


async def test_a_wedged_loop_loses_the_lease_for_good(infra: Infra, cfg: Config) -> None:
    """A loop that stops ticking for longer than ``loop_stall_s`` is wedged, not slow: the renewals stop, the
    lease is lost when it runs out (``on_lost`` once, on the renewal thread, while the loop is still
    blocked), and it is never renewed again."""
    lost_calls: list[tuple[float, str]] = []
    lease = _lease(infra, cfg, "x-wedged", 1, loop_stall_s=0.5,
                   on_lost=lambda: lost_calls.append((time.monotonic(), threading.current_thread().name)))
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    first = lease.valid_until
    await wait_until(lambda: _true(lease.valid_until > first), timeout_s=5, what="a renewal to land")
    assert lease.held()
    blocked = time.monotonic()
    _block_loop(2.5)
    assert lost_calls and blocked < lost_calls[0][0] < blocked + 2.5, "not lost while the loop was blocked"
    assert lost_calls[0][1] == "lease-x-wedged", "found lost by the renewal thread"
    with pytest.raises(LeaseLost, match="lost its lease"):
        lease.check()
    await asyncio.wait_for(keeper, 5)  # the keeper ends by itself: it never renews a lost lease
    assert lease.lost.is_set()
    with pytest.raises(LeaseLost):
        lease.check()
    assert len(lost_calls) == 1, "on_lost runs once"
    deadline = time.monotonic() + 10
    while await executor_alive(infra.leases, "x-wedged"):  # not renewed: the server lets it expire
        assert time.monotonic() < deadline, "the lost lease was renewed"
        await asyncio.sleep(0.2)


async def test_an_entry_gone_on_the_server_loses_the_lease_at_the_next_renewal(infra: Infra, cfg: Config) -> None:
    """Renewals update the revision the last one stored: an entry the server no longer holds (deleted here by
    another connection, as a server-side expiry would drop it) is found at the next renewal, never made anew."""
    lease = _lease(infra, cfg, "x-gone", 2)
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    try:
        await infra.leases.purge("x-gone")
        await asyncio.wait_for(lease.lost.wait(), 5)
        with pytest.raises(LeaseLost):
            lease.check()
        await asyncio.wait_for(keeper, 5)
        assert not await executor_alive(infra.leases, "x-gone"), "the lost lease was written again"
    finally:
        stop.set()
        await asyncio.gather(keeper, return_exceptions=True)


async def test_a_loop_slowed_by_busy_callbacks_keeps_the_lease(infra: Infra, cfg: Config) -> None:
    """Each turn of the loop runs a 0.35 s callback (many runs' work between two reads of the socket): the lease
    stays held (it was lost when each renewal's answer had to be read by the loop within one beat)."""
    lease = _lease(infra, cfg, "x-busy", 6)
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


async def test_a_stopping_holder_deletes_its_lease(infra: Infra, cfg: Config) -> None:
    lease = _lease(infra, cfg, "x-stopping", 2)
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    stop.set()
    await asyncio.wait_for(keeper, 5)
    assert not await executor_alive(infra.leases, "x-stopping")


async def test_a_cancelled_keeper_stops_renewing(infra: Infra, cfg: Config) -> None:
    """Cancelled (its task group stopped), the keeper leaves the entry to expire: the thread renews no more."""
    lease = _lease(infra, cfg, "x-cancelled", 1)
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    keeper = asyncio.create_task(lease.keep(stop))
    await wait_until(lambda: _true(len(lease.renewals) >= 2), timeout_s=5, what="a renewal to land")
    keeper.cancel()
    await asyncio.gather(keeper, return_exceptions=True)
    renewed = len(lease.renewals)
    await wait_until(lambda: _not(executor_alive(infra.leases, "x-cancelled")), timeout_s=5,
                     what="the lease to expire, unrenewed")
    assert len(lease.renewals) == renewed


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


async def test_an_executor_whose_loop_is_blocked_past_its_lease_keeps_its_run(
        infra: Infra, cfg: Config, client: ReelClient, tmp_path: Path) -> None:
    """A healthy executor mid-tool whose event loop is blocked for 1.5 lease TTLs (a starved machine) keeps its
    lease, its executor id and its run: the tool's one attempt succeeds, written by the same executor."""
    from reel.services.executor.app import serve
    from reel.shared.core.workflow.spec import parse_workflow

    go, started = tmp_path / "go", tmp_path / "started"
    spec = parse_workflow(json.dumps({"name": "blocked", "steps": [{"kind": "tool", "id": "wait", "tool": {
        "type": "command", "timeout_s": 60, "argv": ["sh", "-c", ': > "$1"; while [ ! -e "$2" ]; do sleep 0.05; '
                                                 'done; printf ok', "wait", str(started), str(go)]}}]}), fmt="json")
    async with running(serve, infra, cfg, executor_id="x-blocked-executor"):
        reply = await client.start(spec, timeout_s=30)
        assert reply.ok and reply.run_id, reply
        await wait_until(lambda: asyncio.to_thread(started.exists), timeout_s=30, what="the tool to start")
        _block_loop(cfg.lease_ttl_s * 1.5)
        go.touch()
        assert await executor_alive(infra.leases, "x-blocked-executor"), "the executor lost its lease"
        state = await client.wait_for(reply.run_id, ("verifying", "completed", "failed"), timeout_s=30)
    attempts = state.active.attempts["wait"]
    assert [a.status for a in attempts] == ["succeeded"], attempts
    assert state.executor_id == "x-blocked-executor", state.executor_id
    assert {c.writer for _, c in await JetStreamEventLog(infra.nc, cfg.names).read(reply.run_id)} <= {
        "x-blocked-executor", "verifier"}
