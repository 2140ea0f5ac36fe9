"""The contract of the :class:`~reel.shared.core.ports.EventLog` port, run against every implementation.

One suite, one parametrised fixture (:func:`harness`): ``JetStreamEventLog`` on the real
nats-server, and its in-memory twin ``MemoryEventLog`` (shared/memory/eventlog.py, which the
fast unit tests of decisions use); both pass every test unchanged. Another implementation is one
more ``params`` entry and one more branch in the fixture.

What every event log must do: fence (a stale writer conflicts and never overwrites), dedup by
commit id (a retried write lands once), read-your-writes at an LSN (``read``/``load`` up to an
LSN see exactly the commits at or below it, whole), per-run read cost (reading a run fetches
only that run's commits, however many other runs there are), refresh, and snapshots (a load
from a snapshot equals a cold fold and fetches only the commits above the snapshot).

The harness measures what an implementation cannot fake: ``stored()`` asks the store how many
commits it holds; ``fetched()`` counts what the metered ``reader`` received (for JetStream, the
messages its own connection got; for the twin, the commits it returned).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from reel.shared.core.errors import ConcurrencyConflict, RunNotFound
from reel.shared.core.ports import EventLog
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    RunCancelled,
    RunCreated,
    RunStarted,
    StepDecl,
)
from reel.shared.core.run.fold import fold
from reel.shared.core.run.statecodec import STATE_ENCODER
from reel.shared.memory.eventlog import MemoryEventLog, MemoryStore
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra, connect
from reel.shared.nats.subjectlog import DIRECT_GET_BATCH
from reel.shared.runtime.config import Config
from tests.refold import assert_refold_identical

REF = BlobRef(sha256="f" * 64, size_bytes=1)
_enc = STATE_ENCODER  # states hold FrozenMaps: the state codec's hooks


@dataclass
class Harness:
    """One implementation under test.

    Attributes:
        log: the writer (and an ordinary reader).
        reader: another instance on the same store whose reads :attr:`fetched` meters.
        fetched: units the reader has received so far (commits, plus any per-batch overhead).
        stored: how many commits the store holds (all runs).
        batch: the reader's read batch size (a read may fetch one status per batch besides commits).
    """

    log: EventLog
    reader: EventLog
    fetched: Callable[[], int]
    stored: Callable[[], Awaitable[int]]
    batch: int

    async def cost(self, read: Awaitable[object]) -> int:
        """What ``read`` (a read on :attr:`reader`) fetched."""
        before = self.fetched()
        await read
        return self.fetched() - before


@pytest.fixture(params=["jetstream", "memory"])
async def harness(request: pytest.FixtureRequest, cfg: Config, infra: Infra) -> AsyncIterator[Harness]:
    if request.param == "memory":  # the twin uses no server (the session's is there for the other param)
        store = MemoryStore()
        reader = MemoryEventLog(store)

        async def stored_in_memory() -> int:
            return store.stored

        yield Harness(log=MemoryEventLog(store), reader=reader, fetched=lambda: reader.fetched,
                      stored=stored_in_memory, batch=DIRECT_GET_BATCH)
    elif request.param == "jetstream":
        reader_nc = await connect(cfg, name="reel-tests-reader")  # its own connection: its message count is ours

        async def stored() -> int:
            return int((await infra.js.stream_info(cfg.names.events_stream)).state.messages)

        try:
            yield Harness(log=JetStreamEventLog(infra.nc, cfg.names), reader=JetStreamEventLog(reader_nc, cfg.names),
                          fetched=lambda: int(reader_nc.stats["in_msgs"]), stored=stored, batch=DIRECT_GET_BATCH)
        finally:
            await reader_nc.close()
    else:  # pragma: no cover - one branch per implementation
        raise AssertionError(request.param)


def created(run_id: str, steps: int = 1) -> RunCreated:
    return RunCreated(run_id=run_id, branch_id="main", workflow_name="w", workflow_ref=REF, created_ms=1,
                      steps=tuple(StepDecl(step_id=f"s{i}" if steps > 1 else "s", kind="tool", max_attempts=1000)
                                  for i in range(steps)))


def started(executor: str = "x-1") -> RunStarted:
    return RunStarted(executor_id=executor, at_ms=2)


def dispatched(attempt: int, step: str = "s") -> AttemptDispatched:
    return AttemptDispatched(branch_id="main", step_id=step, attempt=attempt, executor_id="x-1", at_ms=3)


# ---- the fence ---------------------------------------------------------------------------------


async def test_commit_read_head_first_lsn(harness: Harness) -> None:
    log = harness.log
    assert await log.head("r-a") is None
    assert await log.first_lsn("r-a") is None
    assert await log.read("r-a") == []
    with pytest.raises(RunNotFound):
        await log.load("r-a")

    lsn1 = await log.commit("r-a", [created("r-a")], expected_lsn=0, writer="t")
    lsn2 = await (await log.commit_async("r-a", [started()], expected_lsn=lsn1, writer="t"))
    assert lsn2 > lsn1 >= 1
    commits = await log.read("r-a")
    assert [lsn for lsn, _ in commits] == [lsn1, lsn2]
    assert [type(c.events[0]) for _, c in commits] == [RunCreated, RunStarted]
    assert all(c.run_id == "r-a" and c.writer == "t" for _, c in commits)
    head = await log.head("r-a")
    assert head is not None and head[0] == lsn2 and head[1] == commits[1][1]
    assert await log.first_lsn("r-a") == lsn1
    state = await log.load("r-a")
    assert (state.status, state.head_lsn, state.created_lsn, state.executor_id) == ("running", lsn2, lsn1, "x-1")
    await assert_refold_identical(log, state)  # type: ignore[arg-type]
    assert await log.list_runs() == ["r-a"]


async def test_stale_writer_gets_conflict_and_never_overwrites(harness: Harness) -> None:
    log = harness.log
    base = await log.commit("r-b", [created("r-b")], expected_lsn=0)
    # two writers both saw `base`; the first to commit wins
    won = await log.commit("r-b", [started("x-winner")], expected_lsn=base, writer="x-winner")
    before = await harness.stored()
    with pytest.raises(ConcurrencyConflict) as info:
        await log.commit("r-b", [started("x-loser")], expected_lsn=base, writer="x-loser")
    assert info.value.run_id == "r-b" and info.value.expected_lsn == base and info.value.retryable
    with pytest.raises(ConcurrencyConflict):  # the pipelined form fails the same way
        await (await log.commit_async("r-b", [started("x-loser")], expected_lsn=base, writer="x-loser"))
    assert await harness.stored() == before
    commits = await log.read("r-b")
    assert [lsn for lsn, _ in commits] == [base, won]
    assert {c.writer for _, c in commits[1:]} == {"x-winner"}
    assert (await log.load("r-b")).executor_id == "x-winner"
    # an expectation from the future is just as stale
    with pytest.raises(ConcurrencyConflict):
        await log.commit("r-b", [started("x-loser")], expected_lsn=won + 100)


async def test_creating_an_existing_run_conflicts(harness: Harness) -> None:
    log = harness.log
    first = await log.commit("r-c", [created("r-c")], expected_lsn=0, writer="first")
    with pytest.raises(ConcurrencyConflict):
        await log.commit("r-c", [created("r-c")], expected_lsn=0, writer="second")
    assert [(lsn, c.writer) for lsn, c in await log.read("r-c")] == [(first, "first")]


async def test_concurrent_writers_with_the_same_expectation_exactly_one_wins(harness: Harness) -> None:
    log = harness.log
    base = await log.commit("r-race", [created("r-race")], expected_lsn=0)
    results = await asyncio.gather(
        *(log.commit("r-race", [started(f"x-{i}")], expected_lsn=base, writer=f"x-{i}") for i in range(8)),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, int)]
    assert len(wins) == 1
    assert all(isinstance(r, ConcurrencyConflict) for r in results if not isinstance(r, int))
    assert len(await log.read("r-race")) == 2


# ---- dedup by commit id ------------------------------------------------------------------------


async def test_retried_commit_with_stale_expectation_returns_the_original_lsn(harness: Harness) -> None:
    """The retry finds the head taken by its own commit id (JetStream: R1 answers 10071)."""
    log = harness.log
    base = await log.commit("r-d", [created("r-d")], expected_lsn=0)
    lsn = await log.commit("r-d", [started()], expected_lsn=base, commit_id="cid-1")
    before = await harness.stored()
    again = await log.commit("r-d", [started()], expected_lsn=base, commit_id="cid-1")
    assert again == lsn
    assert await harness.stored() == before
    assert [c.commit_id for _, c in await log.read("r-d")][1:] == ["cid-1"]


async def test_retried_commit_with_current_expectation_is_deduplicated(harness: Harness) -> None:
    """The expectation matches the head, so only dedup by commit id stops a second commit."""
    log = harness.log
    base = await log.commit("r-e", [created("r-e")], expected_lsn=0)
    lsn = await log.commit("r-e", [started()], expected_lsn=base, commit_id="cid-2")
    before = await harness.stored()
    again = await log.commit("r-e", [started()], expected_lsn=lsn, commit_id="cid-2")
    assert again == lsn
    assert await harness.stored() == before
    assert len(await log.read("r-e")) == 2


async def test_retry_after_someone_else_committed_is_a_conflict_not_a_duplicate(harness: Harness) -> None:
    log = harness.log
    base = await log.commit("r-f", [created("r-f")], expected_lsn=0)
    mine = await log.commit("r-f", [started("x-me")], expected_lsn=base, commit_id="cid-mine")
    await log.commit("r-f", [started("x-other")], expected_lsn=mine, commit_id="cid-other")
    with pytest.raises(ConcurrencyConflict):
        await log.commit("r-f", [started("x-me")], expected_lsn=base, commit_id="cid-mine")
    ids = [c.commit_id for _, c in await log.read("r-f")]
    assert ids.count("cid-mine") == 1 and ids[-1] == "cid-other"


# ---- read-your-writes at an LSN ----------------------------------------------------------------


async def test_reading_one_run_reads_only_its_commits_and_upto_truncates(harness: Harness) -> None:
    log = harness.log
    heads = {r: await log.commit(r, [created(r)], expected_lsn=0) for r in ("r-x", "r-y", "r-z")}
    mine: list[int] = [heads["r-x"]]
    for i in range(1, 13):  # interleave: r-x's commits are spread over the log
        for r in ("r-y", "r-x", "r-z"):
            heads[r] = await log.commit(r, [dispatched(i)], expected_lsn=heads[r])
            if r == "r-x":
                mine.append(heads[r])
    commits = await log.read("r-x")
    assert [lsn for lsn, _ in commits] == mine
    assert {c.run_id for _, c in commits} == {"r-x"}
    cut = mine[5]
    assert [lsn for lsn, _ in await log.read("r-x", upto_lsn=cut)] == mine[:6]
    assert [lsn for lsn, _ in await log.read("r-x", upto_lsn=cut + 1)] == mine[:6]  # r-y/r-z LSN
    assert [lsn for lsn, _ in await log.read("r-x", from_lsn=mine[3], upto_lsn=mine[7])] == mine[3:8]
    assert await log.read("r-x", upto_lsn=mine[0] - 1) == []
    state = await log.load("r-x", upto_lsn=cut)
    assert state.head_lsn == cut and state.commits == 6
    with pytest.raises(RunNotFound):
        await log.load("r-x", upto_lsn=mine[0] - 1)
    assert await log.list_runs() == ["r-x", "r-y", "r-z"]


@pytest.mark.parametrize("bad_id", ["*", ">", "r-w.*", "r-w.x", "", "r w"])
async def test_an_id_that_is_not_one_token_reads_no_run(harness: Harness, bad_id: str) -> None:
    """Run ids arrive in commands; a wildcard must not read other runs."""
    log = harness.log
    await log.commit("r-w", [created("r-w")], expected_lsn=0)
    assert await log.read(bad_id) == []
    assert await log.head(bad_id) is None
    assert await log.first_lsn(bad_id) is None
    with pytest.raises(RunNotFound):
        await log.load(bad_id)


async def test_a_multi_event_commit_is_one_commit(harness: Harness) -> None:
    log = harness.log
    base = await log.commit("r-m", [created("r-m")], expected_lsn=0)
    events: list[AnyEvent] = [started()]
    for n in range(1, 40):
        events += [dispatched(n), AttemptSucceeded(branch_id="main", step_id="s", attempt=n, output_ref=REF,
                                                   at_ms=4)]
    before = await harness.stored()
    lsn = await log.commit("r-m", events, expected_lsn=base)
    assert await harness.stored() == before + 1
    commits = await log.read("r-m")
    assert len(commits) == 2 and commits[1][0] == lsn and commits[1][1].events == tuple(events)


async def test_readers_never_see_half_a_commit(harness: Harness) -> None:
    """A reader racing a writer of 5-event commits only ever sees whole commits."""
    log, reader = harness.log, harness.reader
    head = await log.commit("r-h", [created("r-h")], expected_lsn=0)
    done = asyncio.Event()
    seen: list[int] = []

    async def write() -> None:
        nonlocal head
        for n in range(0, 150, 5):
            head = await log.commit("r-h", [dispatched(n + k) for k in range(1, 6)], expected_lsn=head)
        done.set()

    async def read() -> None:
        while not done.is_set():
            commits = await reader.read("r-h")
            seen.append(len(commits))
            assert all(len(c.events) == 5 for _, c in commits[1:]), "a commit was seen in part"
            state = fold(commits)
            assert state is not None
            assert len(state.branches["main"].attempts.get("s", [])) == 5 * (len(commits) - 1)

    await asyncio.gather(write(), read())
    assert len(seen) > 1 and seen[0] < seen[-1] <= 31, "the reader really raced the writer"


async def test_refresh_applies_only_the_commits_above_the_state(harness: Harness) -> None:
    log, reader = harness.log, harness.reader
    head = await log.commit("r-r", [created("r-r")], expected_lsn=0)
    for i in range(1, 30):
        head = await log.commit("r-r", [dispatched(i)], expected_lsn=head)
    state = await reader.load("r-r")
    same, none = await reader.refresh(state)
    assert none == [] and same.head_lsn == head
    new = [head := await log.commit("r-r", [dispatched(i)], expected_lsn=head) for i in range(30, 33)]
    cost = harness.fetched()
    state, applied = await reader.refresh(same)
    cost = harness.fetched() - cost
    assert [lsn for lsn, _ in applied] == new and state.head_lsn == new[-1]
    assert cost <= len(new) + 1, "only the new commits (and one end-of-batch status)"
    await assert_refold_identical(log, state)  # type: ignore[arg-type]


# ---- per-run read cost -------------------------------------------------------------------------


async def test_reader_cost_does_not_depend_on_other_runs(harness: Harness) -> None:
    """Counted in what the reader received, not in time."""
    log, reader = harness.log, harness.reader
    n_mine = harness.batch + 44  # two read batches
    heads = {"r-me": await log.commit("r-me", [created("r-me")], expected_lsn=0)}
    for i in range(1, n_mine):
        heads["r-me"] = await log.commit("r-me", [dispatched(i)], expected_lsn=heads["r-me"])
        other = f"r-o{i % 7}"
        heads[other] = await log.commit(other, [created(other) if other not in heads else dispatched(i)],
                                        expected_lsn=heads.get(other, 0))

    first = await reader.first_lsn("r-me")
    assert first is not None
    cost = await harness.cost(reader.read("r-me"))
    assert n_mine <= cost <= n_mine + math.ceil(n_mine / harness.batch), \
        "the run's commits, plus at most one end-of-batch status per batch"
    # a pinned read may over-fetch the run's own later commits (one batch at most), never other runs'
    pinned_cost = await harness.cost(reader.read("r-me", upto_lsn=first + 20))
    assert pinned_cost <= harness.batch + 1

    # many more commits of other runs, before, between and after: the read fetches exactly as much
    for i in range(600):
        other = f"r-late{i % 5}"
        heads[other] = await log.commit(other, [created(other) if other not in heads else dispatched(i)],
                                        expected_lsn=heads.get(other, 0))
    assert await harness.cost(reader.read("r-me")) == cost
    assert len(await reader.read("r-me")) == n_mine
    assert await harness.cost(reader.read("r-me", upto_lsn=first + 20)) == pinned_cost
    assert await harness.cost(reader.head("r-me")) == 1
    assert await harness.cost(reader.first_lsn("r-me")) == 1


# ---- snapshots ---------------------------------------------------------------------------------


async def test_a_snapshot_load_equals_a_cold_fold_and_fetches_only_the_commits_above_it(harness: Harness) -> None:
    log, reader = harness.log, harness.reader
    run = "r-snapshot"
    head = await log.commit(run, [created(run, steps=200)], expected_lsn=0)
    for i in range(200):
        head = await log.commit(run, [dispatched(1, f"s{i}")], expected_lsn=head)
        head = await log.commit(run, [AttemptSucceeded(branch_id="main", step_id=f"s{i}", attempt=1, output_ref=REF,
                                                       at_ms=i)], expected_lsn=head)
    store = await log.snapshots()
    assert store is not None
    at_snapshot = await log.load(run, cold=True)
    await store.save(at_snapshot, (await log.read(run))[-1][1].commit_id)
    above = await log.commit(run, [RunCancelled(reason="one more", at_ms=1)], expected_lsn=head)

    cold_cost = await harness.cost(reader.load(run, cold=True))
    warm = await reader.load(run)
    warm_cost = await harness.cost(reader.load(run))
    assert warm.head_lsn == above and warm.status == "cancelled"
    assert _enc.encode(warm) == _enc.encode(await reader.load(run, cold=True))
    pinned = await reader.load(run, upto_lsn=head)  # at the snapshot's own LSN
    assert _enc.encode(pinned) == _enc.encode(await reader.load(run, upto_lsn=head, cold=True))
    assert cold_cost > 401  # every one of the 402 commits
    assert warm_cost < 20, warm_cost  # the snapshot pointer and body, and the 2 commits from its LSN on
    # a load pinned below the snapshot ignores it
    below = await reader.load(run, upto_lsn=head - 1)
    assert below.head_lsn < head and _enc.encode(below) == _enc.encode(await reader.load(run, upto_lsn=head - 1,
                                                                                        cold=True))
