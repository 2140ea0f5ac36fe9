"""One concurrency limit shared by several durable consumers of a process (shared/nats/consumer.py ``Slots``),
as an executor's shared durable and its partitions' durables share ``REEL_MAX_CONCURRENT_RUNS``; real nats-server."""

from __future__ import annotations

import asyncio

from reel.shared.nats.consumer import Ack, CommandConsumer, Delivery, Slots
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config


async def test_two_durables_sharing_slots_never_handle_more_than_the_limit(infra: Infra, cfg: Config) -> None:
    limit, per_subject = 2, 3
    subjects = [cfg.names.command("cancel"), cfg.names.command("rewind")]
    in_flight, most = 0, 0
    started: asyncio.Queue[asyncio.Event] = asyncio.Queue()

    async def handler(_: Delivery) -> Ack:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        release = asyncio.Event()
        await started.put(release)
        await release.wait()
        in_flight -= 1
        return Ack.ACK

    for subject in subjects:
        for i in range(per_subject):
            await infra.js.publish(subject, f"{subject} {i}".encode())
    slots, stop = Slots(limit), asyncio.Event()
    consumers = [CommandConsumer(infra, cfg, f"slots-{i}", [s], handler, slots=slots) for i, s in enumerate(subjects)]
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
    try:
        held = [await asyncio.wait_for(started.get(), 10) for _ in range(limit)]
        # both durables have messages waiting, and each consumer alone would take `limit` of them
        pending = [await infra.js.consumer_info(cfg.names.commands_stream, cfg.names.consumer(c.service))
                   for c in consumers]
        assert sum(p.num_ack_pending for p in pending) == limit
        assert sum(p.num_pending for p in pending) == len(subjects) * per_subject - limit
        for _ in range(len(subjects) * per_subject - limit):  # one out, one in
            held.pop(0).set()
            held.append(await asyncio.wait_for(started.get(), 10))
        for release in held:
            release.set()
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert most == limit and in_flight == 0 and slots.taken == 0
