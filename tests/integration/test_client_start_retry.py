"""``ReelClient.start`` sends a start again when it was refused ``lease_lost`` (the executor that took it was
starved past its lease and wrote nothing), on a real nats-server with a routed consumer answering the starts."""

from __future__ import annotations

import asyncio

from reel.shared.core.errors import LeaseLost
from reel.shared.core.run.ids import RunId
from reel.shared.core.wire.commands import Reply, StartRun
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import START_TRIES, ReelClient
from reel.shared.nats.consumer import CommandConsumer, Delivery, Router
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config

SPEC = parse_workflow('{"name": "retried", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded", '
                      '"output": "x"}}]}', fmt="json")


async def _answering(infra: Infra, cfg: Config, lost: int) -> tuple[list[str], asyncio.Event, asyncio.Task[None]]:
    """A consumer of the start subject that refuses the first ``lost`` starts ``lease_lost``, then accepts."""
    seen: list[str] = []
    router = Router(infra)

    async def start(cmd: StartRun, delivery: Delivery) -> Reply:
        seen.append(delivery.identity)
        if len(seen) <= lost:
            raise LeaseLost("executor x-test lost its lease (not renewed within 1.80s): it writes nothing more")
        return Reply(ok=True, run_id=RunId("r-" + "0" * 20), status="pending", created=True)

    router.route(cfg.names.command("start"), StartRun, start, rejected="t.rejected")
    stop = asyncio.Event()
    task = asyncio.create_task(CommandConsumer(infra, cfg, "start-retry-test", router.subjects, router,
                                               concurrency=1).run(stop))
    return seen, stop, task


async def test_a_start_refused_lease_lost_is_sent_again(infra: Infra, cfg: Config, client: ReelClient) -> None:
    seen, stop, task = await _answering(infra, cfg, lost=START_TRIES - 1)
    try:
        reply = await client.start(SPEC, timeout_s=20)
        assert reply.ok and reply.created, reply
        assert len(seen) == START_TRIES and len(set(seen)) == START_TRIES  # a new command each time
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_a_start_refused_lease_lost_every_time_returns_the_refusal(infra: Infra, cfg: Config,
                                                                        client: ReelClient) -> None:
    seen, stop, task = await _answering(infra, cfg, lost=START_TRIES)
    try:
        reply = await client.start(SPEC, timeout_s=20)
        assert not reply.ok and reply.error is not None and reply.error.code == "lease_lost", reply
        assert reply.error.retryable and len(seen) == START_TRIES
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
