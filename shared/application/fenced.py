"""Fenced commits, written once: load → decide → commit fenced on the head → on a conflict refresh and decide again.

Every mutator of a run (executor, cancel, rewind, recovery, verifier) writes through
:func:`commit_decided`; the creation of a run through :func:`commit_new`. The caller
supplies only a pure ``decide(state) -> Decision`` (:mod:`reel.shared.core.decision`: the events of one
commit, or ``Skip(reason)``; it may raise a :class:`~reel.shared.core.errors.ReelError`: a domain refusal,
propagated unchanged, no retry). It gets back a :class:`Decided`: the state decided on (``before``),
the decision, and the commit (:class:`Committed`: LSN, state after, events), so a handler is
load → decide → commit → reply with no side lists.

This module owns:

* the state decided on: the caller's materialized ``state``, else ``log.load`` (snapshot-aware);
* the fence: each commit names ``state.head_lsn`` as the expected LSN (0 for a new run);
* the conflict path: another writer committed first → ``log.refresh(state)`` applies only the
  commits above the head → ``decide`` again on the refreshed state;
* one retry policy (:data:`DEFAULT_POLICY`, tenacity: bounded tries, small jittered exponential
  backoff); each conflict is logged as ``<log_name>.conflict`` with ``expected_lsn`` and ``try_no``;
  after the last try it raises :class:`~reel.shared.core.errors.ConcurrencyConflict` (retryable).

**Creating a run** is the same loop over an *absent* state: the first try commits the given
events with expected LSN 0; if the run exists (the fence fails), the existing run is loaded and
``if_exists(state)`` decides (by default ``Skip("run exists")``).

Typed against the ports (:mod:`reel.shared.core.ports`) only; no NATS here (import contract).
docs/architecture.md ("One fenced commit") and docs/mutators.md describe the policy.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import msgspec
import structlog
import tenacity

from reel.shared.core.decision import Decision, Skip
from reel.shared.core.errors import ConcurrencyConflict
from reel.shared.core.ports import EventLog
from reel.shared.core.run.events import AnyEvent, Commit
from reel.shared.core.run.fold import apply_commit
from reel.shared.core.run.ids import LSN, CommitId, RunId, new_commit_id
from reel.shared.core.run.state import RunState

logger = structlog.get_logger("reel.fenced")


class Committed(msgspec.Struct, frozen=True):
    """The decided events were committed at ``lsn`` (id ``commit_id``); ``state`` is after applying them."""

    lsn: LSN
    state: RunState
    events: tuple[AnyEvent, ...]
    commit_id: str = ""


class Decided(msgspec.Struct, frozen=True):
    """What one fenced commit did, decided on the last try's state.

    Attributes:
        before: the state the (last) decision was made on: the caller's or loaded one, or the one refreshed
            after a lost fence. States are persistent (:func:`~reel.shared.core.run.fold.apply_commit`), so it is
            the state as it was, not a view of the one after.
        decision: what ``decide(before)`` returned: the events committed, or the :class:`Skip`.
        commit: the commit (``None`` iff ``decision`` is a :class:`Skip`).
    """

    before: RunState
    decision: Decision
    commit: Committed | None = None

    @property
    def state(self) -> RunState:
        """The run now: the state after the commit, else ``before``."""
        return self.commit.state if self.commit is not None else self.before

    @property
    def reason(self) -> str:
        """Why nothing was committed (the :class:`Skip`'s reason); ``""`` when something was."""
        return self.decision.reason if isinstance(self.decision, Skip) else ""


@dataclass(frozen=True)
class Sent:
    """A commit sent ahead of :func:`commit_decided` (``EventLog.commit_async``), to pipeline it with other writes
    (blobs, markers).

    Attributes:
        events: what was sent: the first try's decision (``decide`` is not called again for it).
        commit_id: the id it was sent with.
        lsn: resolves to its LSN, or raises as ``EventLog.commit`` does (ConcurrencyConflict: the fence was lost).
    """

    events: tuple[AnyEvent, ...]
    commit_id: str
    lsn: Awaitable[int]


Decide = Callable[[RunState], Decision]
"""Pure: the events to commit on top of a state, or :class:`Skip`; may raise a ReelError."""
Refresh = Callable[[RunState], Awaitable[RunState]]
"""A state brought up to the run's head (default: ``log.refresh(state)[0]``)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often a fenced commit is re-decided after losing the fence, and how long it waits between.

    Attributes:
        tries: commits attempted in all (the first included) before ConcurrencyConflict is raised.
        backoff_s: the wait before the 2nd try is uniform in ``[0, backoff_s]``; the bound doubles
            each try ("full jitter", so racing writers spread out) up to
        max_backoff_s: the largest bound on one wait.
    """

    tries: int = 20
    backoff_s: float = 0.005
    max_backoff_s: float = 0.2

    def first_wait_s(self) -> float:
        """The jittered wait before the 2nd try (s): uniform in ``[0, backoff_s]``."""
        return random.uniform(0.0, self.backoff_s)

    def retrying(self, on_exhausted: Callable[[tenacity.RetryCallState], NoReturn]) -> tenacity.AsyncRetrying:
        """The tenacity iterator over tries 2…``tries`` (the first runs outside it; see :func:`_loop`):
        retry on ConcurrencyConflict only, waits bounded by 2×, 4×… ``backoff_s``; ``on_exhausted`` after the last."""
        return tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.tries - 1),
            wait=tenacity.wait_random_exponential(multiplier=2 * self.backoff_s, max=self.max_backoff_s),
            retry=tenacity.retry_if_exception_type(ConcurrencyConflict),
            retry_error_callback=on_exhausted,
        )


DEFAULT_POLICY = RetryPolicy()
"""The one policy every mutator uses: 20 tries, waits ≤ 5 ms, 10 ms, 20 ms … capped at 200 ms
(≈ 3 s of waiting at worst before giving up)."""


async def commit_decided(log: EventLog, run_id: str, decide: Decide, *, writer: str,
                         state: RunState | None = None, policy: RetryPolicy = DEFAULT_POLICY,
                         sent: Sent | None = None, refresh: Refresh | None = None,
                         log_name: str | None = None) -> Decided:
    """Commit ``decide(state)`` to ``run_id``, fenced on ``state.head_lsn``; re-decide on conflicts.

    Args:
        decide: pure; called once per try on the state of that try.
        writer: recorded as the commits' writer.
        state: a materialized state of the run to start from (else ``log.load(run_id)``); the
            loop refreshes it, so a caller keeping it must use the returned one.
        policy: the retry policy (:data:`DEFAULT_POLICY`).
        sent: the first try's commit already in flight (fenced on ``state.head_lsn``, of the events
            ``decide(state)`` returns): its events are the first try's decision, its LSN the first try's
            result; ``decide`` is called only for the tries after a lost fence.
        refresh: how a state that lost the fence is brought to the head (default
            ``log.refresh``; a caller that keeps facts beside the state, e.g. rewind's commit
            LSNs, wraps it to keep them in step).
        log_name: prefix of the ``<log_name>.conflict`` log line (default: ``writer``).

    Returns:
        :class:`Decided`: the state decided on, the decision, and the commit (``None`` on a Skip).

    Raises:
        RunNotFound: no ``state`` given and the run has no commit.
        RunCorrupt: the run is corrupt (:mod:`reel.shared.core.run.integrity`), found by the load or by a
            refresh after a lost fence: nothing is ever committed on top of a bad commit.
        ReelError: whatever ``decide`` raised (not retried).
        ConcurrencyConflict: the fence failed on every one of ``policy.tries`` tries.
    """
    if sent is not None and state is None:
        raise ValueError("commit_decided(sent=...) needs the state the sent commit was decided on")
    start = state if state is not None else await log.load(run_id)

    def on_state(s: RunState | None) -> Decision:
        assert s is not None  # a run that exists never becomes absent: its log only grows
        return decide(s)

    return await _loop(log, run_id, on_state, start, writer=writer, policy=policy, sent=sent, refresh=refresh,
                       log_name=log_name or writer)


RUN_EXISTS = Skip("run exists")
""":func:`commit_new`'s default decision on a run that exists already."""


def _exists(_: RunState) -> Decision:
    return RUN_EXISTS


async def commit_new(log: EventLog, run_id: str, events: Sequence[AnyEvent], *, writer: str,
                     if_exists: Decide = _exists, policy: RetryPolicy = DEFAULT_POLICY,
                     log_name: str | None = None) -> Decided:
    """Create ``run_id``: commit ``events`` (starting with ``run_created``) fenced on "no commit yet" (LSN 0).

    If the run exists already (its id comes from an idempotency key, or a racing creator won),
    ``if_exists(existing state)`` decides instead — by default :data:`RUN_EXISTS`. The result's ``before``
    is the existing run's state on a Skip (an "absent" run has no state: on a commit it is the state after).

    Raises:
        ReelError: whatever ``if_exists`` raised.
        ConcurrencyConflict: the fence failed on every try (only when ``if_exists`` commits).
    """
    created = tuple(events)

    def decide(state: RunState | None) -> Decision:
        return created if state is None else if_exists(state)

    return await _loop(log, run_id, decide, None, writer=writer, policy=policy, sent=None, refresh=None,
                       log_name=log_name or writer)


async def _loop(log: EventLog, run_id: str, decide: Callable[[RunState | None], Decision],
                state: RunState | None, *, writer: str, policy: RetryPolicy, sent: Sent | None,
                refresh: Refresh | None, log_name: str) -> Decided:
    """The one loop (see module doc). ``state`` ``None``: the run does not exist (yet)."""
    def exhausted(retry: tenacity.RetryCallState) -> NoReturn:
        raise ConcurrencyConflict(
            f"run {run_id} kept moving: not committed after {retry.attempt_number + 1} tries", run_id=run_id,
            expected_lsn=state.head_lsn if state is not None else 0,
        )

    async def one_try(try_no: int) -> Decided:
        nonlocal state
        if try_no > 1:
            if state is None:
                state = await log.load(run_id)
            else:
                state = await refresh(state) if refresh is not None else (await log.refresh(state))[0]
        ahead = sent if try_no == 1 else None
        decision = ahead.events if ahead is not None else decide(state)
        if isinstance(decision, Skip):
            assert state is not None  # an absent run is always created
            return Decided(before=state, decision=decision)
        events = decision
        expected = state.head_lsn if state is not None else 0
        cid = ahead.commit_id if ahead is not None else new_commit_id()
        try:
            if ahead is not None:
                lsn = await ahead.lsn
            else:
                lsn = await log.commit(run_id, events, expected_lsn=expected, writer=writer, commit_id=cid)
        except ConcurrencyConflict:
            logger.info(f"{log_name}.conflict", expected_lsn=expected, try_no=try_no)
            raise
        done = Commit(commit_id=CommitId(cid), run_id=RunId(run_id), writer=writer, events=events)
        after = apply_commit(state, lsn, done)
        return Decided(before=state if state is not None else after, decision=events,
                       commit=Committed(lsn=LSN(lsn), state=after, events=events, commit_id=cid))

    # the first try runs outside tenacity: it is the hot path (one per step) and building the
    # retrying machinery costs ~70 µs; only a lost fence pays for it
    try:
        return await one_try(1)
    except ConcurrencyConflict:
        if policy.tries <= 1:
            raise
    await asyncio.sleep(policy.first_wait_s())
    async for attempt in policy.retrying(exhausted):
        with attempt:
            return await one_try(attempt.retry_state.attempt_number + 1)
    raise AssertionError("unreachable: tenacity either returns, raises, or calls on_exhausted")  # pragma: no cover
