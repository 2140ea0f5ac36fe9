"""Mutator and executor decisions through the one fenced commit, on the in-memory event log — no server.

:class:`~reel.shared.memory.eventlog.MemoryEventLog` passes the same contract suite as the JetStream log
(tests/integration/test_eventlog_contract.py), so what is tested here is the decision and what the
handler makes of :class:`~reel.shared.application.fenced.Decided`: the fence, a lost try decided again on the
refreshed state, a Skip. Races between processes, redelivery and the server's failures stay in the
integration and fault suites on a real nats-server.
"""

from __future__ import annotations

import pytest

from reel.services.cancel.app import CancelService
from reel.services.executor.attempts import OUTCOME_RECORDED, RUN_MOVED, on_head, record_outcome, settled
from reel.shared.application.fenced import commit_decided
from reel.shared.core.decision import Skip
from reel.shared.core.errors import RunNotFound
from reel.shared.core.mutators import recovery
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    RunCancelled,
    RunCreated,
    RunStarted,
    StepDecl,
)
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.commands import CancelRun
from reel.shared.memory.eventlog import MemoryEventLog
from reel.shared.nats.consumer import Delivery

REF = BlobRef(sha256="a" * 64, size_bytes=3)


async def a_run(log: MemoryEventLog, run_id: str, *later: list[AnyEvent]) -> RunState:
    created = RunCreated(run_id=run_id, branch_id="main", workflow_name="w", workflow_ref=REF, created_ms=0,
                         steps=(StepDecl(step_id="a", kind="tool"),))
    head = 0
    for events in [[created], *later]:
        head = await log.commit(run_id, events, expected_lsn=head, writer="t")
    return await log.load(run_id)


def dispatch(n: int = 1, ex: str = "x-1") -> AttemptDispatched:
    return AttemptDispatched(branch_id="main", step_id="a", attempt=n, executor_id=ex, at_ms=n)


def ok(n: int = 1) -> AttemptSucceeded:
    return AttemptSucceeded(branch_id="main", step_id="a", attempt=n, output_ref=REF, at_ms=n)


DELIVERY = Delivery(subject="t.cmd.cancel", data=b"", reply_to=None, stream_seq=1, stored_ns=1, num_delivered=1,
                    msg_id="m-1")


# ---- cancel: the handler on the twin ------------------------------------------------------------------


async def test_cancel_commits_once_signals_and_a_second_cancel_re_signals_the_same_lsn() -> None:
    log = MemoryEventLog()
    await a_run(log, "r-1", [RunStarted(executor_id="x-1", at_ms=1)])
    signals: list[tuple[str, int]] = []

    async def signal(run_id: str, lsn: int) -> None:
        signals.append((run_id, lsn))

    service = CancelService(log, signal)
    first = await service.cancel(CancelRun(run_id="r-1", reason="stop"), DELIVERY)
    assert (first.ok, first.status, first.detail) == (True, "cancelled", {"previous_status": "running"})
    again = await service.cancel(CancelRun(run_id="r-1"), DELIVERY)
    assert again.status == "cancelled" and again.detail == {"noop": True, "reason": "run is already cancelled"}
    assert signals == [("r-1", first.lsn), ("r-1", first.lsn)]  # the redelivered cancel signals again
    commits = await log.read("r-1")
    assert [type(e) for _, c in commits for e in c.events].count(RunCancelled) == 1


async def test_cancel_of_no_run_is_run_not_found() -> None:
    with pytest.raises(RunNotFound):
        await CancelService(MemoryEventLog()).cancel(CancelRun(run_id="r-none"), DELIVERY)


async def test_a_cancel_that_loses_the_fence_is_decided_again_on_the_run_as_it_is() -> None:
    """The state the handler started from is stale: the result's ``before`` is the refreshed one."""
    log = MemoryEventLog()
    stale = await a_run(log, "r-2")
    await log.commit("r-2", [RunStarted(executor_id="x-9", at_ms=1)], expected_lsn=stale.head_lsn)
    seen: list[str] = []

    def decide(s: RunState) -> tuple[AnyEvent, ...]:
        seen.append(s.status)
        return (RunCancelled(reason=f"was {s.status}", at_ms=2),)

    done = await commit_decided(log, "r-2", decide, writer="cancel", state=stale)
    assert seen == ["pending", "running"]
    assert done.before.status == "running" and done.before.executor_id == "x-9"
    assert done.commit is not None and done.commit.events == (RunCancelled(reason="was running", at_ms=2),)
    assert done.state.status == "cancelled" and done.state.head_lsn == (await log.head("r-2"))[0]  # type: ignore[index]


# ---- the executor's decisions -------------------------------------------------------------------------


async def test_an_intent_planned_on_a_moved_head_is_skipped_with_the_run_as_it_is() -> None:
    log = MemoryEventLog()
    planned = await a_run(log, "r-3", [RunStarted(executor_id="x-1", at_ms=1)])
    await log.commit("r-3", [RunCancelled(at_ms=2)], expected_lsn=planned.head_lsn)
    done = await commit_decided(log, "r-3", on_head(planned.head_lsn, [dispatch()]), writer="x-1", state=planned)
    assert done.commit is None and done.decision == RUN_MOVED and done.state.status == "cancelled"
    assert len(await log.read("r-3")) == 3  # nothing written


async def test_an_outcome_lands_on_any_head_once_and_a_cancel_turns_it_cancelled() -> None:
    log = MemoryEventLog()
    state = await a_run(log, "r-4", [RunStarted(executor_id="x-1", at_ms=1)], [dispatch()])
    first = await commit_decided(log, "r-4", settled(record_outcome(ok())), writer="x-1", state=state)
    assert first.commit is not None and first.commit.events == (ok(),)
    again = await commit_decided(log, "r-4", settled(record_outcome(ok())), writer="x-1", state=state)
    assert again.decision == OUTCOME_RECORDED and again.before.head_lsn == first.state.head_lsn

    other = await a_run(log, "r-5", [RunStarted(executor_id="x-1", at_ms=1)], [dispatch()], [RunCancelled(at_ms=2)])
    late = await commit_decided(log, "r-5", settled(record_outcome(ok())), writer="x-1", state=other)
    assert late.commit is not None and [type(e) for e in late.commit.events] == [AttemptCancelled]


# ---- recovery's decision ------------------------------------------------------------------------------


async def test_recovery_resolves_a_dead_executors_intent_from_its_marker_or_as_lost() -> None:
    log = MemoryEventLog()
    await a_run(log, "r-6", [RunStarted(executor_id="x-dead", at_ms=1)], [dispatch(1, "x-dead")],
                [AttemptFailed(branch_id="main", step_id="a", attempt=1, error_kind="exit_1", message="",
                               retryable=True, at_ms=2)], [dispatch(2, "x-dead")], [RunCancelled(at_ms=3)])
    state = await log.load("r-6")
    markers: dict[str, BlobRef | None] = {"r-6.main.a.2": None}
    done = await commit_decided(log, "r-6", lambda s: recovery.decide(s, dead={"x-dead"}, markers=markers, at_ms=9),
                                writer="recovery", state=state)
    plan = recovery.plan(done.before, dead={"x-dead"}, markers=markers)
    assert [i.marker_key for i in plan.resolve] == ["r-6.main.a.2"]
    assert done.commit is not None and [recovery.outcome_of(e) for e in done.commit.events] == ["cancelled"]
    nothing = await commit_decided(log, "r-6", lambda s: recovery.decide(s, dead={"x-dead"}, markers=markers,
                                                                         at_ms=9), writer="recovery")
    assert nothing.decision == Skip("nothing to resolve") and nothing.commit is None
