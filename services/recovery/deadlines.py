"""Input-request deadlines and durable timers, fired by recovery (a clock outside the fold; docs/mutators.md,
"respond"; docs/workflow.md, "Sleep steps").

A request may carry a deadline and a declared default (:mod:`reel.shared.core.input.requestevents`).
Recovery's sweep looks at the runs whose earliest open deadline has passed
(:meth:`~reel.services.recovery.index.IntentIndex.due`) and commits each due request's default
as its ``input_answered`` (source ``deadline``), fenced on the head: an answer that came
first makes the request no longer due, so a default fires once. Like an answer by command,
it then asks an executor to go on unless the run's live owner drives it.

A sleeping run's timer is fired the same way, in the same commit: once the clock reads its wake time,
``run_woke`` (:func:`reel.shared.core.run.timers.due_events`), then a ``ResumeRun``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from reel.services.runtime.resume import resume_unless_driven
from reel.shared.application.fenced import commit_decided
from reel.shared.core.ports import EventLog
from reel.shared.core.run import timers
from reel.shared.core.run.events import InputAnswered, RunWoke
from reel.shared.core.run.state import RunState
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config

log = structlog.get_logger("reel.recovery")


async def fire_due(infra: Infra, cfg: Config, events: EventLog, state: RunState, now_ms: int, *, writer: str
                   ) -> list[dict[str, Any]]:
    """Commit the default of every request of ``state``'s run due at ``now_ms`` (epoch ms) and its timer's
    ``run_woke`` if due (one commit fenced on ``state.head_lsn``, the run refreshed on a conflict); what was
    fired: ``[{run, request_id, step, decision, lsn}]`` per request, ``[{run, woke, step, wake_ms, late_ms, lsn}]``
    for the timer; empty if nothing was due.

    Raises:
        RunCorrupt: a refresh after a lost fence found the run corrupt.
        ConcurrencyConflict: the run kept moving for every try of the retry policy.
    """
    run_id = state.run_id
    done = await commit_decided(events, run_id, lambda s: timers.due_events(s, now_ms), writer=writer,
                                state=state, log_name="recovery")
    if (commit := done.commit) is None:
        return []
    fired: list[dict[str, Any]] = [
        {"run": run_id, "request_id": e.request_id, "step": e.step_id, "decision": e.decision, "lsn": commit.lsn}
        for e in commit.events if isinstance(e, InputAnswered)]
    timer = timers.sleeping_timer(done.before.status, done.before.active)
    woke = [{"run": run_id, "woke": True, "step": e.step_id, "wake_ms": timer.wake_ms,
             "late_ms": e.at_ms - timer.wake_ms, "lsn": commit.lsn}
            for e in commit.events if isinstance(e, RunWoke) and timer is not None]
    resume = await resume_unless_driven(infra, cfg.names, done.before, commit.lsn)
    if fired:
        log.info("recovery.deadline_fired", run_id=run_id, requests=[f["request_id"] for f in fired], lsn=commit.lsn,
                 previous_status=done.before.status, resume=resume)
    for w in woke:
        log.info("recovery.timer_fired", run_id=run_id, step_id=w["step"], wake_ms=w["wake_ms"],
                 late_ms=w["late_ms"], lsn=commit.lsn, resume=resume)
    return fired + woke


async def nap(stop: asyncio.Event, changed: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less: until ``stop`` is set or ``changed`` is (a new deadline to wake for)."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(changed.wait())]
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):  # unlike 3.11's wait_for, never swallows a cancel
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
