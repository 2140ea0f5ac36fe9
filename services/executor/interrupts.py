"""Stopping the side effects in flight: a run's cancel, or the executor's drain deadline (docs/mutators.md).

Each drive watches its run (:class:`~reel.shared.nats.control.ControlHub`): its
:class:`~reel.shared.nats.control.Interrupt` fires with ``cancelled`` when the cancel service
signals the run's ``run_cancelled`` commit, and with ``shutdown`` when the executor's drain
deadline passes (``REEL_DRAIN_DEADLINE_S`` after SIGTERM). Then every side effect the drive
has in flight is cancelled — the awaiting task, which for a command kills its process group
(:func:`reel.shared.proc.group.run_group`), for an async Python tool cancels the tool's coroutine,
for a model call aborts its HTTP request — and each attempt gets an outcome at once:
``attempt_failed`` with ``error_kind`` :data:`~reel.shared.core.run.state.INTERRUPTED` (retryable, not a
try of the step). On a cancelled run the commit records it ``attempt_cancelled`` instead
(:func:`reel.shared.core.mutators.cancel.after_cancel` decides every executor commit), so the kind only
stays when the executor was shutting down: another executor runs a new attempt.

The watch also fires ``lost`` when it finds the run taken over by another executor: then the side effects are
stopped the same way but nothing is recorded (:class:`RunLost`; services/executor/driver.py).

A **sync** Python tool runs in a worker thread, which Python cannot stop: its attempt is
recorded at once all the same, and the thread's late result is discarded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from reel.shared.core.run.state import INTERRUPTED, RunState
from reel.shared.nats.control import Cause, Interrupt

T = TypeVar("T")

MESSAGES: dict[Cause, str] = {
    "cancelled": "the run was cancelled while this attempt ran; the attempt was stopped",
    "shutdown": "the executor shut down (its drain deadline passed, or Ctrl-C stopped the `reel run` it ran in) while"
                " this attempt ran; the attempt was stopped"
                " and another executor runs a new one",
    "lost": "another executor took the run over while this attempt ran; the attempt was stopped",
}


class Interrupted(Exception):
    """The side effect was stopped because of ``cause``; ``message`` is the attempt's error message."""

    def __init__(self, cause: Cause) -> None:
        super().__init__(MESSAGES[cause])
        self.cause = cause
        self.kind = INTERRUPTED
        self.message = MESSAGES[cause]
        self.retryable = True
        self.cost_usd = 0.0


class RunLost(Exception):
    """Another executor took the run over while this one drove it (a fence lost to its claim, or the interrupt fired
    ``lost``): the drive stops at once and records nothing — its tools are killed (services/executor/driver.py).
    ``state``: the run as this executor last knew it."""

    def __init__(self, state: RunState) -> None:
        super().__init__(f"run {state.run_id} was taken over by {state.executor_id or 'another executor'}")
        self.state = state


def lost(interrupt: Interrupt | None) -> bool:
    """Whether ``interrupt`` fired ``lost``."""
    return interrupt is not None and interrupt.cause == "lost"


async def guarded(side_effect: Awaitable[T], interrupt: Interrupt | None) -> T:
    """Await ``side_effect``; if ``interrupt`` fires first, cancel it (and wait until it is stopped).

    ``interrupt`` ``None``: awaited as is (instant side effects: recorded and scripted tools and models).

    Raises:
        Interrupted: the interrupt fired before the side effect finished.
        whatever ``side_effect`` raises.
    """
    if interrupt is None:
        return await side_effect
    if interrupt.fired.done():
        if asyncio.iscoroutine(side_effect):
            side_effect.close()  # never started
        raise Interrupted(interrupt.fired.result())
    task = asyncio.ensure_future(side_effect)
    try:
        await asyncio.wait((task, interrupt.fired), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)  # the group is killed, the request aborted, before we go on
    raise Interrupted(interrupt.fired.result())


async def stopped_within(seconds: float, stopping: asyncio.Event | None, interrupt: Interrupt | None) -> bool:
    """Wait ``seconds`` (a provider's Retry-After) unless ``stopping`` is set or ``interrupt`` fires first
    (then ``True``)."""
    ends: list[asyncio.Future[Any]] = [] if interrupt is None else [interrupt.fired]
    if stopping is not None:
        ends.append(asyncio.ensure_future(stopping.wait()))
    if not ends:
        await asyncio.sleep(seconds)
        return False
    try:
        done, _ = await asyncio.wait(ends, timeout=seconds)
    finally:
        if stopping is not None:
            ends[-1].cancel()
    return bool(done)
