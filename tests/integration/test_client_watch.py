"""``ReelClient.watch_commits`` (what ``reel run`` follows a run with) on a real server.

The first item of a ``history`` watch carries every commit from the run's first,
each later item exactly the commits above the previous one; every state equals a
cold re-fold at its head. A watch started before the run exists waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from reel.shared.core.errors import RunNotFound
from reel.shared.core.run.events import AttemptDispatched, BlobRef, Commit, RunCreated, RunStarted, StepDecl
from reel.shared.core.run.ids import new_run_id
from reel.shared.core.run.state import RunState
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.refold import assert_refold_identical

REF = BlobRef(sha256="f" * 64, size_bytes=1)
Item = tuple[RunState, list[tuple[int, Commit]]]


def created(run_id: str) -> RunCreated:
    return RunCreated(run_id=run_id, branch_id="main", workflow_name="w", workflow_ref=REF,
                      steps=(StepDecl(step_id="s", kind="tool", max_attempts=1000),), created_ms=1)


def dispatched(attempt: int) -> AttemptDispatched:
    return AttemptDispatched(branch_id="main", step_id="s", attempt=attempt, executor_id="x-1", at_ms=3)


class _Observed(JetStreamEventLog):
    """The real event log, noting when a read or load found no run (the rendezvous for "it is waiting")."""

    def __init__(self, infra: Infra, cfg: Config) -> None:
        super().__init__(infra.nc, cfg.names)
        self.missed = asyncio.Event()

    async def read(self, run_id: str, **kw: int | None) -> list[tuple[int, Commit]]:
        got = await super().read(run_id, **kw)
        if not got:
            self.missed.set()
        return got

    async def load(self, run_id: str, **kw: int | bool | None) -> RunState:
        try:
            return await super().load(run_id, **kw)
        except RunNotFound:
            self.missed.set()
            raise


async def _next(items: AsyncIterator[Item]) -> Item:
    return await asyncio.wait_for(anext(items), 10)


async def test_history_watch_carries_every_commit_once_in_order(client: ReelClient,
                                                                event_log: JetStreamEventLog) -> None:
    rid = new_run_id()
    lsn1 = await event_log.commit(rid, [created(rid)], expected_lsn=0)
    lsn2 = await event_log.commit(rid, [RunStarted(executor_id="x-1", at_ms=2)], expected_lsn=lsn1)
    items = client.watch_commits(rid, history=True, poll_s=0.01)
    state, commits = await _next(items)
    assert [lsn for lsn, _ in commits] == [lsn1, lsn2] and state.head_lsn == lsn2
    assert [type(e) for _, c in commits for e in c.events] == [RunCreated, RunStarted]
    await assert_refold_identical(event_log, state)

    lsn3 = await event_log.commit(rid, [dispatched(1)], expected_lsn=lsn2)
    lsn4 = await event_log.commit(rid, [dispatched(2)], expected_lsn=lsn3)
    seen: list[int] = []
    while not seen or seen[-1] < lsn4:
        state, commits = await _next(items)
        assert commits, "a later item always carries the commits it adds"
        seen += [lsn for lsn, _ in commits]
        assert state.head_lsn == seen[-1]
    assert seen == [lsn3, lsn4]
    await assert_refold_identical(event_log, state)
    await items.aclose()


async def test_watch_waits_for_a_run_that_does_not_exist_yet(client: ReelClient, event_log: JetStreamEventLog,
                                                             infra: Infra, cfg: Config) -> None:
    observed = _Observed(infra, cfg)
    client.log = observed
    for history in (True, False):
        rid = new_run_id()
        observed.missed.clear()
        items = client.watch_commits(rid, history=history, poll_s=0.01)
        first = asyncio.ensure_future(_next(items))
        await asyncio.wait_for(observed.missed.wait(), 10)  # it looked, found no run, and waits
        assert not first.done()
        lsn = await event_log.commit(rid, [created(rid)], expected_lsn=0)
        state, commits = await first
        assert state.run_id == rid and state.head_lsn == lsn
        assert [c for c, _ in commits] == ([lsn] if history else [])  # without history: the loaded state only
        await items.aclose()
    states = client.watch(rid, poll_s=0.01)
    assert (await asyncio.wait_for(anext(states), 10)).head_lsn == lsn
    await states.aclose()
