"""Recovery's index of open intents: runs folded in memory from an ordered consumer on ``<ns>.ev.>``.

The index is a *hint* that tells the sweep which runs may need recovery without
re-reading every run each time; every decision is then made on a cold fold of
the run's own subject (the log is the truth). It keeps the folded state of
every run that is live or still has an open intent, and forgets a run once it
rests (awaiting_input/sleeping/verifying/completed/cancelled) with no open intent, no
open input request with a deadline and no timer to fire (:meth:`IntentIndex.due` finds those for the sweep).
A commit it cannot
apply — a run it forgot that is forked again, a run whose first commits aged out
of the stream — marks the run *stale*: the next sweep loads it from the log. A
bad commit (one that does not decode, names another run or is an illegal
transition: :mod:`reel.shared.core.run.integrity`), or a load that finds the run corrupt,
marks the run *corrupt*: logged once, never swept again.

It also keeps the runs that rest in ``verifying`` (run id → the LSN of their
``run_verifying`` commit), until a commit takes them out of it (``run_completed``,
``run_cancelled``, a fork): the sweep re-triggers the verifier for those with no
trigger queued (services/recovery/app.py).

Consistency rule: a state loaded from the log is adopted only if it is at least
as new as the last commit the consumer delivered for that run, and the consumer
applies only commits above the state's head, so the two sources never double-
apply or skip a commit.
"""

from __future__ import annotations

import asyncio

import structlog
from nats.aio.msg import Msg

from reel.shared.core.run import integrity
from reel.shared.core.run.events import (
    AttemptDispatched,
    BranchForked,
    InputRequested,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunSleeping,
)
from reel.shared.core.run.planning import has_open_intent
from reel.shared.core.run.state import DRIVABLE, RESTING, VERIFYING, RunState
from reel.shared.core.run.timers import next_due, next_wake

log = structlog.get_logger("reel.recovery")


class IntentIndex:
    """Folded states of the runs that may hold open intents (see module doc)."""

    def __init__(self, subject_prefix: str) -> None:
        self._prefix = subject_prefix
        self.states: dict[str, RunState] = {}
        self.stale: set[str] = set()
        self.verifying: dict[str, int] = {}  # run id → LSN of its run_verifying commit, while it rests there
        self.corrupt: dict[str, integrity.Corruption] = {}
        self._deadlines: dict[str, int] = {}  # run id → its earliest input deadline or wake time (epoch ms), tracked
        self._seen: dict[str, int] = {}
        self.last_seq = 0
        self._progress = asyncio.Condition()
        self.deadlines_changed = asyncio.Event()  # set when a deadline or a timer is observed (the sweep wakes)

    async def on_msg(self, msg: Msg) -> None:
        """Ordered-consumer callback: apply one commit message."""
        run_id = msg.subject[len(self._prefix):]
        lsn = msg.metadata.sequence.stream
        try:
            self.observe(run_id, lsn, msg.data)
        finally:
            async with self._progress:
                self.last_seq = max(self.last_seq, lsn)
                self._progress.notify_all()

    def observe(self, run_id: str, lsn: int, data: bytes) -> None:
        """Apply the commit at ``lsn`` of ``run_id`` (pure bookkeeping, no I/O)."""
        self._seen[run_id] = max(lsn, self._seen.get(run_id, 0))
        state = self.states.get(run_id)
        if run_id in self.corrupt or (state is not None and lsn <= state.head_lsn):
            return  # nothing counts above a bad commit; or already in a state adopted from the log
        try:
            commit = integrity.check_commit(run_id, lsn, data)
            if isinstance(commit, integrity.Corruption):
                self.mark_corrupt(commit)
                return
            if any((isinstance(e, InputRequested) and e.deadline_ms is not None) or isinstance(e, RunSleeping)
                   for e in commit.events):
                self.deadlines_changed.set()
            if state is None and run_id in self.verifying and any(
                    isinstance(e, RunCompleted | RunCancelled | BranchForked) for e in commit.events):
                del self.verifying[run_id]  # a fork also makes the run stale below: its reload decides
            if state is None and not (commit.events and isinstance(commit.events[0], RunCreated)):
                if any(isinstance(e, AttemptDispatched | BranchForked) for e in commit.events):
                    self.stale.add(run_id)
                return
            applied = integrity.apply_checked(state, lsn, commit)
            if isinstance(applied, integrity.Corruption):
                self.mark_corrupt(applied)
                return
            self.states[run_id] = state = applied
        except Exception as exc:  # the index is a hint: a commit it cannot apply sends the run to a cold load
            log.warning("recovery.index_unreadable", run_id=run_id, lsn=lsn, error=str(exc))
            self.states.pop(run_id, None)
            self._deadlines.pop(run_id, None)
            self.verifying.pop(run_id, None)
            self.stale.add(run_id)
            return
        self._forget_if_done(state)

    def mark_corrupt(self, bad: integrity.Corruption) -> None:
        """Stop tracking a corrupt run (one ``recovery.run_corrupt`` line, the first time)."""
        if bad.run_id not in self.corrupt:
            log.warning("recovery.run_corrupt", run_id=bad.run_id, lsn=bad.lsn, kind=bad.kind, reason=bad.reason)
        self.corrupt[bad.run_id] = bad
        self.states.pop(bad.run_id, None)
        self._deadlines.pop(bad.run_id, None)
        self.verifying.pop(bad.run_id, None)
        self.stale.discard(bad.run_id)

    def offer(self, state: RunState) -> None:
        """Adopt a state loaded from the log, if no newer commit of the run has been delivered."""
        if state.run_id in self.corrupt or state.head_lsn < self._seen.get(state.run_id, 0):
            return  # the consumer is ahead of this read; stay stale until a newer load
        self.stale.discard(state.run_id)
        self._seen[state.run_id] = state.head_lsn
        self.states[state.run_id] = state
        self._forget_if_done(state)

    def _forget_if_done(self, state: RunState) -> None:
        """Keep ``state``'s verifying LSN and earliest input deadline in step; drop a run with nothing left to watch."""
        if state.status == VERIFYING and state.verifying_lsn is not None:
            self.verifying[state.run_id] = state.verifying_lsn
        else:
            self.verifying.pop(state.run_id, None)
        deadline = next_due(state.status, state.active)  # an input deadline or a wake time
        if deadline is not None:
            self._deadlines[state.run_id] = deadline
            return
        self._deadlines.pop(state.run_id, None)
        if state.status in RESTING and not has_open_intent(state):
            self.states.pop(state.run_id, None)

    def due(self, now_ms: int) -> set[str]:
        """Tracked runs with an open input request whose deadline, or a timer whose wake time, is at or before
        ``now_ms`` (epoch ms)."""
        return {run_id for run_id, d in self._deadlines.items() if d <= now_ms}

    def next_deadline(self) -> int | None:
        """The earliest input deadline or wake time of a tracked run (epoch ms), if any."""
        return min(self._deadlines.values(), default=None)

    def sleeping(self) -> list[tuple[int, str]]:
        """``(wake_ms, run id)`` of each tracked run resting in ``sleeping``, earliest first (epoch ms)."""
        wakes = ((next_wake(s.status, s.active), run_id) for run_id, s in self.states.items())
        return sorted((w, run_id) for w, run_id in wakes if w is not None)

    def candidates(self) -> list[RunState]:
        """Tracked runs that have at least one open intent."""
        return [s for s in self.states.values() if has_open_intent(s)]

    def idle(self) -> list[RunState]:
        """Tracked runs in ``pending`` or ``running`` with no open intent: nothing recovery resolves, but an
        executor must drive them (self-healing; O(tracked runs): the index holds live runs only)."""
        return [s for s in self.states.values() if s.status in DRIVABLE and not has_open_intent(s)]

    async def wait_for_seq(self, seq: int, timeout_s: float) -> bool:
        """Wait until every commit up to stream sequence ``seq`` has been observed; False on timeout."""
        async def reached() -> None:
            async with self._progress:
                await self._progress.wait_for(lambda: self.last_seq >= seq)

        try:
            await asyncio.wait_for(reached(), timeout_s)
        except TimeoutError:
            return False
        return True
