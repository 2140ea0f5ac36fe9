"""Cancel service: ``<ns>.cmd.cancel`` → ``run_cancelled`` (brief §2, §3; docs/mutators.md).

Per command: load the run (cold fold), :func:`decide`, commit fenced on the head
LSN it folded. A concurrent commit (an executor mid-run) makes the fence fail;
the handler re-reads and decides again, a few times. Cancelling is legal from
``pending``, ``running`` and ``verifying``; cancelling a ``completed`` or
``cancelled`` run is answered ``ok`` with the status unchanged and
``detail.noop = true``. An executor driving the run stops on its own: its next
fenced commit conflicts, it re-reads, and the planner rests on a cancelled run.
A held ``EpisodeView`` is untouched: the cancel is one more commit above it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import structlog

from shared.clock import now_ms
from shared.config import Config
from shared.core.commands import CancelRun, Reply, decode_command, error_reply
from shared.core.errors import ConcurrencyConflict, InvalidCommand, ReelError
from shared.core.events import RunCancelled
from shared.core.fold import LIVE, RunState
from shared.core.ids import LSN, is_token
from shared.nats.consumer import Ack, Command, CommandConsumer, send_reply
from shared.nats.eventlog import JetStreamEventLog
from shared.nats.infra import Infra

log = structlog.get_logger("reel.cancel")

WRITER = "cancel"
MAX_TRIES = 10


class NoOp(msgspec.Struct, frozen=True, kw_only=True):
    """Nothing to commit: the run already ended."""

    reason: str


def decide(state: RunState, cmd: CancelRun, *, at_ms: int) -> RunCancelled | NoOp:
    """Pure: the event cancelling ``state``, or why there is nothing to do."""
    if state.status in LIVE:
        return RunCancelled(reason=cmd.reason, at_ms=at_ms)
    return NoOp(reason=f"run is already {state.status}")


class CancelService:
    """Handles cancel commands against the event log."""

    def __init__(self, infra: Infra, cfg: Config) -> None:
        self.infra = infra
        self.log = JetStreamEventLog(infra.nc, cfg.names)

    async def handle(self, cmd: Command) -> Ack:
        """Decode, cancel (with fenced retries), reply; every refusal is a reply, never a crash."""
        try:
            req = decode_command(cmd.data, CancelRun)
            if not is_token(req.run_id):
                raise InvalidCommand(f"run_id {req.run_id!r} is not a valid run id", run_id=None)
            structlog.contextvars.bind_contextvars(run_id=req.run_id)
            reply = await self._cancel(req)
        except ReelError as exc:
            log.warning("cancel.rejected", code=exc.code, reason=exc.message, stream_seq=cmd.stream_seq)
            reply = error_reply(exc)
        await send_reply(self.infra, cmd, reply)
        return Ack.ACK

    async def _cancel(self, req: CancelRun) -> Reply:
        for attempt in range(1, MAX_TRIES + 1):
            state = await self.log.load(req.run_id)
            structlog.contextvars.bind_contextvars(branch_id=state.active_branch)
            decision = decide(state, req, at_ms=now_ms())
            if isinstance(decision, NoOp):
                log.info("cancel.noop", status=state.status, reason=decision.reason, lsn=state.head_lsn)
                detail: dict[str, Any] = {"noop": True, "reason": decision.reason}
                return Reply(ok=True, run_id=state.run_id, status=state.status, detail=detail)
            try:
                lsn = await self.log.commit(state.run_id, [decision], expected_lsn=state.head_lsn, writer=WRITER)
            except ConcurrencyConflict:
                log.info("cancel.conflict", expected_lsn=state.head_lsn, attempt=attempt)
                await asyncio.sleep(0.01 * attempt)
                continue
            log.info("cancel.committed", previous_status=state.status, lsn=lsn, reason=req.reason)
            return Reply(ok=True, run_id=state.run_id, status="cancelled", lsn=LSN(lsn),
                         detail={"previous_status": state.status})
        raise ConcurrencyConflict(f"run {req.run_id} kept moving; cancel not committed after {MAX_TRIES} tries",
                                  run_id=req.run_id)


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, **_: Any) -> None:
    """Run one cancel service instance until ``stop`` is set."""
    service = CancelService(infra, cfg)
    consumer = CommandConsumer(infra, cfg, "cancel", [cfg.names.command("cancel")], service.handle)
    await consumer.run(stop)
