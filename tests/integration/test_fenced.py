"""The one fenced-commit mechanism (shared/application/fenced.py) on a real nats-server.

Conflicts are real: another writer commits to the run on the server between the
state a decision was made on and its commit (:class:`Interloper` does that before
each of its first ``n`` commits, on the real log), so the fence really fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from reel.shared.application.fenced import DEFAULT_POLICY, RetryPolicy, Sent, commit_decided, commit_new
from reel.shared.core.decision import Decision, Skip
from reel.shared.core.errors import ConcurrencyConflict, InvalidTransition, RunNotFound
from reel.shared.core.run.events import AnyEvent, BlobRef, RunCancelled, RunCreated, RunStarted, StepDecl
from reel.shared.core.run.ids import new_commit_id
from reel.shared.core.run.state import RunState
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.logcapture import info_logs
from tests.refold import assert_refold_identical

REF = BlobRef(sha256="f" * 64, size_bytes=1)
FAST = RetryPolicy(tries=3, backoff_s=0.001, max_backoff_s=0.002)


def created(run_id: str) -> RunCreated:
    return RunCreated(run_id=run_id, branch_id="main", workflow_name="w", workflow_ref=REF,
                      steps=(StepDecl(step_id="s", kind="tool"),), created_ms=1)


class Interloper:
    """The real event log, except that before each of its first ``n`` fenced commits another
    writer commits ``run_started`` to the same run, so the fence fails on the server."""

    def __init__(self, real: JetStreamEventLog, n: int) -> None:
        self.real, self.left, self.commits = real, n, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    async def commit(self, run_id: str, events: Sequence[AnyEvent], *, expected_lsn: int, writer: str = "",
                     commit_id: str | None = None) -> int:
        self.commits += 1
        if self.left > 0:
            self.left -= 1
            head = await self.real.head(run_id)
            await self.real.commit(run_id, [RunStarted(executor_id=f"x-{self.left}", at_ms=2)],
                                   expected_lsn=head[0] if head else 0, writer="interloper")
        return await self.real.commit(run_id, events, expected_lsn=expected_lsn, writer=writer, commit_id=commit_id)


async def test_decides_on_the_loaded_state_and_commits_fenced_on_its_head(event_log: JetStreamEventLog) -> None:
    base = await event_log.commit("r-1", [created("r-1")], expected_lsn=0)
    seen: list[int] = []

    def decide(state: RunState) -> Decision:
        seen.append(state.head_lsn)
        return (RunCancelled(reason="x", at_ms=3),)

    result = await commit_decided(event_log, "r-1", decide, writer="t")
    done = result.commit
    assert done is not None and seen == [base]
    assert result.before.head_lsn == base and result.before.status == "pending"  # the state decided on, as it was
    assert result.decision == done.events == (RunCancelled(reason="x", at_ms=3),)
    assert result.state is done.state and done.state.status == "cancelled" and done.state.head_lsn == done.lsn > base
    commits = await event_log.read("r-1")
    assert [(lsn, c.writer, c.commit_id) for lsn, c in commits[1:]] == [(done.lsn, "t", done.commit_id)]
    await assert_refold_identical(event_log, result.state)


async def test_a_conflict_refreshes_and_decides_again(event_log: JetStreamEventLog) -> None:
    await event_log.commit("r-2", [created("r-2")], expected_lsn=0)
    stale = await event_log.load("r-2")
    log = Interloper(event_log, n=2)
    decided_on: list[tuple[int, str | None]] = []

    def decide(state: RunState) -> Decision:
        decided_on.append((state.head_lsn, state.executor_id))
        return (RunCancelled(reason=f"seen {state.executor_id}", at_ms=3),)

    with info_logs() as logs:
        result = await commit_decided(log, "r-2", decide, writer="t", state=stale, policy=FAST,  # type: ignore[arg-type]
                                      log_name="cancel")
    assert result.commit is not None
    commits = await event_log.read("r-2")
    assert [c.writer for _, c in commits] == ["", "interloper", "interloper", "t"]
    # each try decided on the state the previous try lost to (the interloper's commit applied)
    assert decided_on == [(commits[0][0], None), (commits[1][0], "x-1"), (commits[2][0], "x-0")]
    assert result.commit.events == result.decision == (RunCancelled(reason="seen x-0", at_ms=3),)
    # the result names the state the last try decided on: no side list needed
    before = result.before
    assert (before.head_lsn, before.executor_id, before.status) == (commits[2][0], "x-0", "running")
    assert [(e["event"], e["try_no"], e["expected_lsn"]) for e in logs if e["event"] == "cancel.conflict"] == [
        ("cancel.conflict", 1, commits[0][0]), ("cancel.conflict", 2, commits[1][0])]
    await assert_refold_identical(event_log, result.state)


async def test_no_commit_writes_nothing(event_log: JetStreamEventLog) -> None:
    base = await event_log.commit("r-3", [created("r-3")], expected_lsn=0)
    result = await commit_decided(event_log, "r-3", lambda s: Skip(f"is {s.status}"), writer="t")
    assert result.commit is None and result.decision == Skip("is pending") and result.reason == "is pending"
    assert result.state is result.before and result.before.head_lsn == base
    assert len(await event_log.read("r-3")) == 1


async def test_a_domain_error_propagates_untried_again(event_log: JetStreamEventLog) -> None:
    await event_log.commit("r-4", [created("r-4")], expected_lsn=0)
    calls = 0

    def decide(state: RunState) -> Decision:
        nonlocal calls
        calls += 1
        raise InvalidTransition("not now", run_id=state.run_id)

    with pytest.raises(InvalidTransition, match="not now"):
        await commit_decided(event_log, "r-4", decide, writer="t")
    assert calls == 1 and len(await event_log.read("r-4")) == 1


async def test_a_missing_run_is_run_not_found(event_log: JetStreamEventLog) -> None:
    with pytest.raises(RunNotFound):
        await commit_decided(event_log, "r-none", lambda s: (RunCancelled(at_ms=1),), writer="t")


async def test_losing_every_try_raises_concurrency_conflict(event_log: JetStreamEventLog) -> None:
    await event_log.commit("r-5", [created("r-5")], expected_lsn=0)
    log = Interloper(event_log, n=FAST.tries)
    with pytest.raises(ConcurrencyConflict) as info:
        await commit_decided(log, "r-5", lambda s: (RunCancelled(at_ms=3),), writer="t", policy=FAST)  # type: ignore[arg-type]
    assert info.value.retryable and info.value.run_id == "r-5"
    assert f"after {FAST.tries} tries" in info.value.message
    assert log.commits == FAST.tries
    assert {c.writer for _, c in await event_log.read("r-5")} == {"", "interloper"}


async def _send(log: JetStreamEventLog, state: RunState, events: Sequence[AnyEvent]) -> Sent:
    cid = new_commit_id()
    return Sent(events=tuple(events), commit_id=cid, lsn=await log.commit_async(
        state.run_id, events, expected_lsn=state.head_lsn, writer="t", commit_id=cid))


async def test_an_in_flight_first_try_that_loses_is_decided_again(event_log: JetStreamEventLog) -> None:
    base = await event_log.commit("r-6", [created("r-6")], expected_lsn=0)
    state = await event_log.load("r-6")
    other = await event_log.commit("r-6", [RunStarted(executor_id="x-9", at_ms=2)], expected_lsn=base)
    events: list[AnyEvent] = [RunCancelled(reason="mine", at_ms=3)]
    sent = await _send(event_log, state, events)
    result = await commit_decided(event_log, "r-6", lambda s: tuple(events), writer="t", state=state, sent=sent)
    assert result.commit is not None and result.commit.lsn > other and result.before.head_lsn == other
    assert [c.writer for _, c in await event_log.read("r-6")] == ["", "", "t"]


async def test_an_in_flight_first_try_that_wins_is_the_result(event_log: JetStreamEventLog) -> None:
    await event_log.commit("r-7", [created("r-7")], expected_lsn=0)
    state = await event_log.load("r-7")
    events: list[AnyEvent] = [RunCancelled(reason="mine", at_ms=3)]
    sent = await _send(event_log, state, events)
    decided_on: list[int] = []

    def decide(s: RunState) -> tuple[AnyEvent, ...]:
        decided_on.append(s.head_lsn)
        return tuple(events)

    result = await commit_decided(event_log, "r-7", decide, writer="t", state=state, sent=sent)
    assert result.commit is not None and result.state.status == "cancelled" and result.before is state
    assert decided_on == []  # the sent events are the first try's decision: not decided a second time
    commits = await event_log.read("r-7")
    assert len(commits) == 2 and commits[1][1].commit_id == result.commit.commit_id == sent.commit_id


async def test_commit_new_creates_once(event_log: JetStreamEventLog) -> None:
    first = await commit_new(event_log, "r-8", [created("r-8")], writer="a")
    assert first.commit is not None and first.state.status == "pending" and first.state.head_lsn == first.commit.lsn
    again = await commit_new(event_log, "r-8", [created("r-8")], writer="b")
    assert again.commit is None and again.reason == "run exists" and again.before.head_lsn == first.commit.lsn
    assert [c.writer for _, c in await event_log.read("r-8")] == ["a"]


async def test_racing_creators_one_wins_the_others_see_it(event_log: JetStreamEventLog) -> None:
    results = await asyncio.gather(*(commit_new(event_log, "r-9", [created("r-9")], writer=f"w{i}")
                                     for i in range(6)))
    wins = [r.commit for r in results if r.commit is not None]
    assert len(wins) == 1
    assert sorted(r.state.head_lsn for r in results) == [wins[0].lsn] * 6
    assert sum(r.reason == "run exists" for r in results) == 5
    assert len(await event_log.read("r-9")) == 1


async def test_commit_new_on_an_existing_run_may_decide_on_it(event_log: JetStreamEventLog) -> None:
    await commit_new(event_log, "r-10", [created("r-10")], writer="a")
    result = await commit_new(event_log, "r-10", [created("r-10")], writer="b",
                              if_exists=lambda s: (RunCancelled(reason="dup", at_ms=5),))
    assert result.commit is not None and result.state.status == "cancelled" and result.before.status == "pending"


def test_the_default_policy_is_bounded_and_jittered() -> None:
    """Waits are drawn uniformly under a doubling bound (capped), so racing writers spread out."""
    assert DEFAULT_POLICY.tries == 20
    retrying = DEFAULT_POLICY.retrying(lambda _: (_ for _ in ()).throw(AssertionError()))
    bounds = [min(DEFAULT_POLICY.max_backoff_s, DEFAULT_POLICY.backoff_s * 2 ** (n - 1)) for n in range(1, 20)]
    assert bounds[0] == 0.005 and bounds[-1] == 0.2 and sum(bounds) < 4.0

    class State:
        def __init__(self, n: int) -> None:
            self.attempt_number = n

    first = {DEFAULT_POLICY.first_wait_s() for _ in range(50)}  # before the 2nd try (the 1st runs outside tenacity)
    assert all(0 <= w <= bounds[0] for w in first) and len(first) > 1
    for n, bound in enumerate(bounds[1:], start=1):  # tenacity's attempt n is the (n+1)-th try
        waits = {retrying.wait(State(n)) for _ in range(50)}  # type: ignore[arg-type]
        assert all(0 <= w <= bound for w in waits) and len(waits) > 1
