"""An executor's own attempts that no drive of it holds any more: resolved by the executor itself.

Recovery resolves a settled intent (superseded, on an inactive branch, in a resting run) only once its
writer's lease is gone; a live executor is trusted to record its own. But when a drive raises between an
intent and its outcome (the command is nak'ed and driven again), that attempt is held by no drive: the
next drive supersedes it (by this executor, or by another that took the run over), and recovery would
answer ``waiting: executor_alive`` about it for as long as this executor lives. So:

* at the end of every drive — its attempts in flight all recorded (services/executor/driver.py) — the
  executor resolves its own settled open intents of that run (:func:`reel.shared.core.mutators.recovery.abandon`,
  one fenced commit, the stored output when its marker is found, else ``executor_lost``);
* a run whose drive raised is remembered, and looked at again every lease TTL while no drive of it runs
  here, until none of its intents of this executor is open (another executor may own the run by now).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Container

import structlog

from reel.shared.application.fenced import commit_decided
from reel.shared.core.mutators import recovery
from reel.shared.core.ports import EventLog
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.state import RunState
from reel.shared.runtime.clock import now_ms

from .attempts import LOG_NAME, Attempts

log = structlog.get_logger("reel.executor")


class Orphans:
    """Resolves the settled intents of ``attempts.executor_id`` that none of its drives holds.

    Attributes:
        crashed: runs whose drive raised here (an intent of this executor may be left open), tended by
            :meth:`tend_loop` until none is.
    """

    def __init__(self, log: EventLog, attempts: Attempts) -> None:
        self.log, self.attempts = log, attempts
        self.executor_id = attempts.executor_id
        self.crashed: set[str] = set()

    async def settle(self, state: RunState) -> RunState:
        """Resolve this executor's own settled open intents of ``state``'s run (none of them may be in a drive:
        call it when the drive has ended); the run's state after that (``state`` itself when there are none).

        Raises:
            ConcurrencyConflict: the run kept moving for every try of the retry policy.
            RunCorrupt: the run turned out corrupt on a refresh.
        """
        intents = recovery.own_settled(state, self.executor_id)
        if not intents:
            return state
        markers: dict[str, BlobRef | None] = {
            i.marker_key: await self.attempts.marker(i.run_id, i.origin_branch_id, i.step_id, i.attempt)
            for i in intents}
        at_ms = now_ms()

        done = await commit_decided(self.log, state.run_id,
                                    lambda s: recovery.abandon(s, self.executor_id, markers, at_ms=at_ms),
                                    writer=self.executor_id, state=state, log_name=LOG_NAME)
        for event in done.commit.events if done.commit is not None else ():
            log.info("attempt.abandoned", step_id=getattr(event, "step_id", None),
                     attempt=getattr(event, "attempt", None), outcome=recovery.outcome_of(event),
                     lsn=done.state.head_lsn)
        return done.state

    async def tend(self, run_id: str) -> bool:
        """Load ``run_id`` and :meth:`settle` it; True when no intent of this executor is open in it any more."""
        state = await self.settle(await self.log.load(run_id))
        return not any(i.executor_id == self.executor_id for i in recovery.open_intents(state))

    async def tend_loop(self, driving: Callable[[], Container[str]], stop: asyncio.Event, interval_s: float) -> None:
        """Every ``interval_s`` until ``stop``: :meth:`tend` each :attr:`crashed` run not in ``driving()``
        (a drive of it settles it when it ends); a run is forgotten once none of its intents here is open.
        A failure is logged and retried on the next pass. Never raises."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):  # unlike 3.11's wait_for, never swallows a cancel
                    await stop.wait()
            for run_id in sorted(self.crashed):
                if run_id in driving():
                    continue
                try:
                    if await self.tend(run_id):
                        self.crashed.discard(run_id)
                except Exception as exc:  # the next pass tries again
                    log.warning("attempt.abandon_failed", run_id=run_id, error=repr(exc)[:300])
