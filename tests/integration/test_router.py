"""Command routing in the consumer shell (shared/nats/consumer.py ``Router``) on a real nats-server.

One routed consumer per test, concurrency 1, so a reply to a later command also
means the earlier one was acked (the shell handles one message at a time then).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import structlog

from reel.shared.core.errors import RunNotFound
from reel.shared.core.wire.commands import CancelRun, RecoverRuns, Reply
from reel.shared.core.wire.subjects import REPLY_TO_HEADER
from reel.shared.nats.consumer import Ack, CommandConsumer, Delivery, Router, Then
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.logcapture import info_logs


class Commands:
    """Publishes raw command bodies with a reply inbox and returns the service's reply."""

    def __init__(self, infra: Infra) -> None:
        self.infra = infra

    async def send(self, subject: str, body: bytes) -> tuple[Reply, int]:
        inbox = self.infra.nc.new_inbox()
        sub = await self.infra.nc.subscribe(inbox, max_msgs=1)
        try:
            ack = await self.infra.js.publish(subject, body, headers={REPLY_TO_HEADER: inbox})
            msg = await sub.next_msg(timeout=10)
        finally:
            await sub.unsubscribe()
        return msgspec.json.decode(msg.data, type=Reply), ack.seq


@pytest.fixture
async def routed(infra: Infra, cfg: Config) -> AsyncIterator[tuple[Router, Commands]]:
    router = Router(infra)
    seen: dict[str, Any] = {}
    release = asyncio.Event()
    done: asyncio.Queue[str] = asyncio.Queue()

    async def cancel(cmd: CancelRun, delivery: Delivery) -> Reply:
        seen["context"] = structlog.contextvars.get_contextvars()
        if cmd.reason == "missing":
            raise RunNotFound(f"no run {cmd.run_id!r}", run_id=cmd.run_id)
        return Reply(ok=True, run_id=cmd.run_id, detail={"subject": delivery.subject})

    async def recover(cmd: RecoverRuns, _: Delivery) -> Then:
        async def work() -> Ack:
            await release.wait()
            await done.put(cmd.run_id or "")
            return Ack.ACK

        return Then(Reply(ok=True, run_id=cmd.run_id, status="working"), work)

    router.route(cfg.names.command("cancel"), CancelRun, cancel, rejected="t.rejected", bind={"route": "cancel"})
    router.route(cfg.names.command("recover"), RecoverRuns, recover, rejected="t.rejected",
                 rejected_fields={"command": "recover"})
    router.seen, router.release, router.done = seen, release, done  # type: ignore[attr-defined]
    stop = asyncio.Event()
    consumer = CommandConsumer(infra, cfg, "router-test", router.subjects, router, concurrency=1)
    task = asyncio.create_task(consumer.run(stop))
    try:
        yield router, Commands(infra)
    finally:
        release.set()
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_a_routed_command_is_decoded_bound_and_answered(routed: tuple[Router, Commands], cfg: Config) -> None:
    router, commands = routed
    assert router.subjects == [cfg.names.command("cancel"), cfg.names.command("recover")]
    reply, _ = await commands.send(cfg.names.command("cancel"), b'{"run_id": "r-1"}')
    assert reply == Reply(ok=True, run_id="r-1", detail={"subject": cfg.names.command("cancel")})
    context = router.seen["context"]  # type: ignore[attr-defined]
    assert context["run_id"] == "r-1" and context["route"] == "cancel" and context["service"] == "router-test"


@pytest.mark.parametrize(("body", "code", "message"), [
    (b'{"run_id": ', "invalid_command", "CancelRun is not valid JSON"),
    (b'{"run_id": "*"}', "invalid_command", "run_id '*' is not a valid run id"),
    (b'{"run_id": "r-2", "colour": 1}', "invalid_command", "colour"),
    (b'{"run_id": "r-2", "reason": "missing"}', "run_not_found", "no run 'r-2'"),
])
async def test_a_refusal_is_an_error_reply_a_log_line_and_an_ack(
        routed: tuple[Router, Commands], cfg: Config, infra: Infra, body: bytes, code: str, message: str) -> None:
    _, commands = routed
    with info_logs() as logs:
        reply, seq = await commands.send(cfg.names.command("cancel"), body)
    assert reply.ok is False and reply.error is not None
    assert reply.error.code == code and message in reply.error.message
    rejected = [e for e in logs if e["event"] == "t.rejected"]
    assert [(e["code"], e["stream_seq"]) for e in rejected] == [(code, seq)]
    assert ("run_id" in rejected[0]) == (code == "run_not_found"), "the run id is bound only once it is valid"
    # the next command is handled only after this one was acked (concurrency 1)
    await commands.send(cfg.names.command("cancel"), b'{"run_id": "r-3"}')
    info = await infra.js.consumer_info(cfg.names.commands_stream, cfg.names.consumer("router-test"))
    assert info.ack_floor.stream_seq >= seq


async def test_then_replies_first_and_acks_after_the_work(routed: tuple[Router, Commands], cfg: Config,
                                                          infra: Infra) -> None:
    router, commands = routed
    reply, seq = await commands.send(cfg.names.command("recover"), b'{"run_id": "r-4"}')
    assert reply == Reply(ok=True, run_id="r-4", status="working")
    info = await infra.js.consumer_info(cfg.names.commands_stream, cfg.names.consumer("router-test"))
    assert info.num_ack_pending == 1 and info.ack_floor.stream_seq < seq, "un-acked while the work runs"
    router.release.set()  # type: ignore[attr-defined]
    assert await asyncio.wait_for(router.done.get(), 10) == "r-4"  # type: ignore[attr-defined]


async def test_an_optional_run_id_may_be_absent(routed: tuple[Router, Commands], cfg: Config) -> None:
    router, commands = routed
    router.release.set()  # type: ignore[attr-defined]
    reply, _ = await commands.send(cfg.names.command("recover"), b"{}")
    assert reply.ok and reply.run_id is None
    with info_logs() as logs:
        bad, _ = await commands.send(cfg.names.command("recover"), b'{"run_id": "a.b"}')
    assert bad.error is not None and bad.error.code == "invalid_command"
    assert [e.get("command") for e in logs if e["event"] == "t.rejected"] == ["recover"]
