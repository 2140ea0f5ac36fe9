"""Cancel service: ``<ns>.cmd.cancel`` → ``run_cancelled`` (docs/mutators.md); it also answers
input requests, ``<ns>.cmd.respond`` → ``input_answered`` (services/cancel/answers.py).

Per command: :func:`reel.shared.application.fenced.commit_decided` with :func:`reel.shared.core.mutators.cancel.decide`
(load the run, decide, commit fenced on its head; a concurrent commit — an executor
mid-run — makes the fence fail, and the run is refreshed and decided again).
Cancelling is legal from ``pending``, ``running``, ``awaiting_input`` and ``verifying``; cancelling a
``completed`` or ``cancelled`` run is answered ``ok`` with the status unchanged and
``detail.noop = true``. After the commit the service publishes a
:class:`~reel.shared.core.wire.livemessages.RunControl` on ``<ns>.ctl.<run_id>`` (core NATS): the executor
driving the run stops what it has in flight at once — the tool's process group killed, the
Python tool's task cancelled, the model's HTTP request aborted — and records those attempts
``attempt_cancelled`` (services/executor/interrupts.py); nothing further is dispatched (its
next intent loses the fence, and the planner rests on a cancelled run). The log stays the
source of truth: an executor that missed the signal still never records a success or a
failure after the cancel (:func:`reel.shared.core.mutators.cancel.after_cancel`), and it reads the log of every run it
drives each ``REEL_CANCEL_CHECK_S`` (1 s), so a lost signal delays the stop by at most that. A cancel
command that finds the run **already cancelled** (its own redelivery after the service died between
commit and signal, or a second cancel) re-sends the signal with the cancel's LSN — the signal is
idempotent — so every acknowledged cancel is signalled at least once; its consumer's ack wait is
``REEL_MUTATOR_ACK_WAIT_S`` (5 s), the delay before a dead instance's cancel is handled again.
``REEL_CANCEL_CRASH_AT=after_commit`` (fault injection) exits the process (137) between the commit and
the signal. A verifier already
running is not interrupted: its verdict is still recorded and published.
A held ``EpisodeView`` is untouched: the cancel is one more commit above it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from reel.shared.application.fenced import commit_decided
from reel.shared.core.mutators import cancel
from reel.shared.core.ports import EventLog
from reel.shared.core.wire.commands import CancelRun, Reply
from reel.shared.nats.commandbus import JetStreamCommandBus
from reel.shared.nats.consumer import CommandConsumer, Delivery, Router
from reel.shared.nats.consumergate import consumer_gate
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.clock import now_ms
from reel.shared.runtime.config import Config

from . import answers

log = structlog.get_logger("reel.cancel")

WRITER = "cancel"
CANCEL_CRASH_ENV = "REEL_CANCEL_CRASH_AT"
"""Fault injection: ``after_commit`` — the process exits (137) after a cancel's commit, before its signal."""


class CancelService:
    """Handles cancel commands against the event log."""

    def __init__(self, events: EventLog, signal: Callable[[str, int], Awaitable[None]] | None = None) -> None:
        self.log = events
        self.signal = signal
        self._crash_at = os.environ.get(CANCEL_CRASH_ENV, "")

    async def cancel(self, req: CancelRun, _: Delivery) -> Reply:
        """Cancel ``req.run_id`` (fenced, re-decided on conflicts); the reply."""
        at_ms = now_ms()
        done = await commit_decided(self.log, req.run_id, lambda s: cancel.decide(s, req, at_ms=at_ms), writer=WRITER)
        before, commit = done.before, done.commit
        structlog.contextvars.bind_contextvars(branch_id=before.active_branch)
        if commit is None:
            log.info("cancel.noop", status=before.status, reason=done.reason, lsn=before.head_lsn)
            if before.status == "cancelled":
                await self._signal_again(before.run_id)
            return Reply(ok=True, run_id=before.run_id, status=before.status,
                         detail={"noop": True, "reason": done.reason})
        log.info("cancel.committed", previous_status=before.status, lsn=commit.lsn, reason=req.reason)
        await self._signal(before.run_id, commit.lsn)
        return Reply(ok=True, run_id=before.run_id, status="cancelled", lsn=commit.lsn,
                     detail={"previous_status": before.status})

    async def _signal(self, run_id: str, lsn: int) -> None:
        """Signal the cancel committed at ``lsn`` (``REEL_CANCEL_CRASH_AT=after_commit``: exit 137 first)."""
        if self._crash_at == "after_commit":
            log.error("cancel.crash_injected", point=self._crash_at, lsn=lsn)
            os._exit(137)
        if self.signal is not None:
            await self.signal(run_id, lsn)

    async def _signal_again(self, run_id: str) -> None:
        """Re-send the signal of ``run_id``'s committed cancel (its LSN read from the log; idempotent)."""
        if self.signal is None:
            return
        lsn = cancel.cancel_lsn(await self.log.read(run_id))
        if lsn is not None:
            log.info("cancel.signal_resent", lsn=lsn)
            await self.signal(run_id, lsn)


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, **_: Any) -> None:
    """Run one cancel service instance until ``stop`` is set."""
    service = CancelService(JetStreamEventLog(infra.nc, cfg.names), JetStreamCommandBus(infra.nc, cfg.names).control)
    router = Router(infra)
    router.route(cfg.names.command("cancel"), CancelRun, service.cancel, rejected="cancel.rejected")
    answers.route(router, infra, cfg, service.log)
    async with consumer_gate(infra.nc, cfg.names):  # clients' consumers, vetted (docs/security.md)
        await CommandConsumer(infra, cfg, "cancel", router.subjects, router,
                              ack_wait_s=cfg.mutator_ack_wait_s).run(stop)
