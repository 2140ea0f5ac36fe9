"""The event log on a real nats-server (brief §4, §10): fenced commits, dedup, per-run reads.

No mocks: every assertion about "what is in the stream" asks the server (stream info,
raw message get) or counts the messages a connection actually received.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js import api as jsapi

from shared.config import Config
from shared.core.errors import ConcurrencyConflict, RunNotFound
from shared.core.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    RunCreated,
    RunStarted,
    StepDecl,
    decode_commit,
)
from shared.core.fold import fold
from shared.core.subjects import Names
from shared.nats.eventlog import DIRECT_GET_BATCH, JetStreamEventLog
from shared.nats.infra import Infra, connect, ensure_infra
from tests.refold import assert_refold_identical

REF = BlobRef(sha256="f" * 64, size_bytes=1)


def created(run_id: str) -> RunCreated:
    return RunCreated(run_id=run_id, branch_id="main", workflow_name="w", workflow_ref=REF,
                      steps=(StepDecl(step_id="s", kind="tool", max_attempts=1000),), created_ms=1)


def started(executor: str = "x-1") -> RunStarted:
    return RunStarted(executor_id=executor, at_ms=2)


def dispatched(attempt: int) -> AttemptDispatched:
    return AttemptDispatched(branch_id="main", step_id="s", attempt=attempt, executor_id="x-1", at_ms=3)


async def stream_messages(infra: Infra, cfg: Config) -> int:
    return (await infra.js.stream_info(cfg.names.events_stream)).state.messages


@pytest.fixture
async def reader_nc(cfg: Config, infra: Infra) -> AsyncIterator[Client]:
    """A second connection, used only for reads, so its message counter measures them exactly."""
    nc = await connect(cfg, name="reel-tests-reader")
    try:
        yield nc
    finally:
        await nc.close()


async def test_commit_read_head_first_lsn(event_log: JetStreamEventLog) -> None:
    assert await event_log.head("r-a") is None
    assert await event_log.first_lsn("r-a") is None
    assert await event_log.read("r-a") == []
    with pytest.raises(RunNotFound):
        await event_log.load("r-a")

    lsn1 = await event_log.commit("r-a", [created("r-a")], expected_lsn=0, writer="t")
    lsn2 = await event_log.commit("r-a", [started()], expected_lsn=lsn1, writer="t")
    assert lsn2 > lsn1 >= 1
    commits = await event_log.read("r-a")
    assert [lsn for lsn, _ in commits] == [lsn1, lsn2]
    assert [type(c.events[0]) for _, c in commits] == [RunCreated, RunStarted]
    assert all(c.run_id == "r-a" and c.writer == "t" for _, c in commits)
    head = await event_log.head("r-a")
    assert head is not None and head[0] == lsn2 and head[1] == commits[1][1]
    assert await event_log.first_lsn("r-a") == lsn1
    state = await event_log.load("r-a")
    assert (state.status, state.head_lsn, state.created_lsn, state.executor_id) == ("running", lsn2, lsn1, "x-1")
    await assert_refold_identical(event_log, state)
    assert await event_log.list_runs() == ["r-a"]


async def test_stale_writer_gets_conflict_and_never_overwrites(event_log: JetStreamEventLog, infra: Infra,
                                                             cfg: Config) -> None:
    base = await event_log.commit("r-b", [created("r-b")], expected_lsn=0)
    # two writers both saw `base`; the first to commit wins
    won = await event_log.commit("r-b", [started("x-winner")], expected_lsn=base, writer="x-winner")
    before = await stream_messages(infra, cfg)
    with pytest.raises(ConcurrencyConflict) as info:
        await event_log.commit("r-b", [started("x-loser")], expected_lsn=base, writer="x-loser")
    assert info.value.run_id == "r-b" and info.value.expected_lsn == base and info.value.retryable
    assert await stream_messages(infra, cfg) == before
    commits = await event_log.read("r-b")
    assert [lsn for lsn, _ in commits] == [base, won]
    assert {c.writer for _, c in commits[1:]} == {"x-winner"}
    assert (await event_log.load("r-b")).executor_id == "x-winner"
    # an expectation from the future is just as stale
    with pytest.raises(ConcurrencyConflict):
        await event_log.commit("r-b", [started("x-loser")], expected_lsn=won + 100)


async def test_creating_an_existing_run_conflicts(event_log: JetStreamEventLog) -> None:
    first = await event_log.commit("r-c", [created("r-c")], expected_lsn=0, writer="first")
    with pytest.raises(ConcurrencyConflict):
        await event_log.commit("r-c", [created("r-c")], expected_lsn=0, writer="second")
    assert [(lsn, c.writer) for lsn, c in await event_log.read("r-c")] == [(first, "first")]


async def test_concurrent_writers_with_the_same_expectation_exactly_one_wins(event_log: JetStreamEventLog) -> None:
    base = await event_log.commit("r-race", [created("r-race")], expected_lsn=0)
    results = await asyncio.gather(
        *(event_log.commit("r-race", [started(f"x-{i}")], expected_lsn=base, writer=f"x-{i}") for i in range(8)),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, int)]
    assert len(wins) == 1
    assert all(isinstance(r, ConcurrencyConflict) for r in results if not isinstance(r, int))
    assert len(await event_log.read("r-race")) == 2


async def test_retried_commit_with_stale_expectation_returns_the_original_lsn(
        event_log: JetStreamEventLog, infra: Infra, cfg: Config) -> None:
    """R1 answers the retry with 10071; the head's commit id says it was ours (brief §10)."""
    base = await event_log.commit("r-d", [created("r-d")], expected_lsn=0)
    lsn = await event_log.commit("r-d", [started()], expected_lsn=base, commit_id="cid-1")
    before = await stream_messages(infra, cfg)
    again = await event_log.commit("r-d", [started()], expected_lsn=base, commit_id="cid-1")
    assert again == lsn
    assert await stream_messages(infra, cfg) == before
    assert [c.commit_id for _, c in await event_log.read("r-d")][1:] == ["cid-1"]


async def test_retried_commit_with_current_expectation_is_deduplicated(
        event_log: JetStreamEventLog, infra: Infra, cfg: Config) -> None:
    """The expectation matches the head, so only Nats-Msg-Id dedup stops a second message."""
    base = await event_log.commit("r-e", [created("r-e")], expected_lsn=0)
    lsn = await event_log.commit("r-e", [started()], expected_lsn=base, commit_id="cid-2")
    before = await stream_messages(infra, cfg)
    again = await event_log.commit("r-e", [started()], expected_lsn=lsn, commit_id="cid-2")
    assert again == lsn
    assert await stream_messages(infra, cfg) == before
    assert len(await event_log.read("r-e")) == 2


async def test_retry_after_someone_else_committed_is_a_conflict_not_a_duplicate(
        event_log: JetStreamEventLog) -> None:
    base = await event_log.commit("r-f", [created("r-f")], expected_lsn=0)
    mine = await event_log.commit("r-f", [started("x-me")], expected_lsn=base, commit_id="cid-mine")
    await event_log.commit("r-f", [started("x-other")], expected_lsn=mine, commit_id="cid-other")
    with pytest.raises(ConcurrencyConflict):
        await event_log.commit("r-f", [started("x-me")], expected_lsn=base, commit_id="cid-mine")
    ids = [c.commit_id for _, c in await event_log.read("r-f")]
    assert ids.count("cid-mine") == 1 and ids[-1] == "cid-other"


async def test_reading_one_run_reads_only_its_messages_and_upto_truncates(event_log: JetStreamEventLog) -> None:
    heads = {r: await event_log.commit(r, [created(r)], expected_lsn=0) for r in ("r-x", "r-y", "r-z")}
    mine: list[int] = [heads["r-x"]]
    for i in range(1, 13):  # interleave: r-x's commits are spread over the stream
        for r in ("r-y", "r-x", "r-z"):
            heads[r] = await event_log.commit(r, [dispatched(i)], expected_lsn=heads[r])
            if r == "r-x":
                mine.append(heads[r])
    commits = await event_log.read("r-x")
    assert [lsn for lsn, _ in commits] == mine
    assert {c.run_id for _, c in commits} == {"r-x"}
    cut = mine[5]
    assert [lsn for lsn, _ in await event_log.read("r-x", upto_lsn=cut)] == mine[:6]
    assert [lsn for lsn, _ in await event_log.read("r-x", upto_lsn=cut + 1)] == mine[:6]  # r-y/r-z LSN
    assert [lsn for lsn, _ in await event_log.read("r-x", from_lsn=mine[3], upto_lsn=mine[7])] == mine[3:8]
    assert await event_log.read("r-x", upto_lsn=mine[0] - 1) == []
    state = await event_log.load("r-x", upto_lsn=cut)
    assert state.head_lsn == cut and state.commits == 6
    with pytest.raises(RunNotFound):
        await event_log.load("r-x", upto_lsn=mine[0] - 1)
    assert await event_log.list_runs() == ["r-x", "r-y", "r-z"]


@pytest.mark.parametrize("bad_id", ["*", ">", "r-w.*", "r-w.x", "", "r w"])
async def test_an_id_that_is_not_one_token_reads_no_run(event_log: JetStreamEventLog, bad_id: str) -> None:
    """Run ids arrive in commands; a wildcard must not read other runs' subjects."""
    await event_log.commit("r-w", [created("r-w")], expected_lsn=0)
    assert await event_log.read(bad_id) == []
    assert await event_log.head(bad_id) is None
    assert await event_log.first_lsn(bad_id) is None
    with pytest.raises(RunNotFound):
        await event_log.load(bad_id)


async def test_a_multi_event_commit_is_one_message(event_log: JetStreamEventLog, infra: Infra, cfg: Config) -> None:
    base = await event_log.commit("r-m", [created("r-m")], expected_lsn=0)
    events: list[AnyEvent] = [started()]
    for n in range(1, 40):
        events += [dispatched(n), AttemptSucceeded(branch_id="main", step_id="s", attempt=n, output_ref=REF,
                                                   at_ms=4)]
    before = await stream_messages(infra, cfg)
    lsn = await event_log.commit("r-m", events, expected_lsn=base)
    assert await stream_messages(infra, cfg) == before + 1
    raw = await infra.js.get_msg(cfg.names.events_stream, lsn)
    assert raw.subject == cfg.names.events("r-m")
    assert decode_commit(raw.data).events == tuple(events)
    commits = await event_log.read("r-m")
    assert len(commits) == 2 and len(commits[1][1].events) == len(events)


async def test_readers_never_see_half_a_commit(event_log: JetStreamEventLog, cfg: Config, reader_nc: Client) -> None:
    """A reader racing a writer of 5-event commits only ever sees whole commits."""
    reader = JetStreamEventLog(reader_nc, cfg.names)
    head = await event_log.commit("r-h", [created("r-h")], expected_lsn=0)
    done = asyncio.Event()
    seen: list[int] = []

    async def write() -> None:
        nonlocal head
        for n in range(0, 150, 5):
            head = await event_log.commit("r-h", [dispatched(n + k) for k in range(1, 6)], expected_lsn=head)
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


async def test_reader_cost_does_not_depend_on_other_runs(event_log: JetStreamEventLog, cfg: Config,
                                                         reader_nc: Client) -> None:
    """Counted in messages the reader's connection received, not in time (brief §4)."""
    reader = JetStreamEventLog(reader_nc, cfg.names)
    n_mine = DIRECT_GET_BATCH + 44  # two Direct Get batches
    heads = {"r-me": await event_log.commit("r-me", [created("r-me")], expected_lsn=0)}
    for i in range(1, n_mine):
        heads["r-me"] = await event_log.commit("r-me", [dispatched(i)], expected_lsn=heads["r-me"])
        other = f"r-o{i % 7}"
        heads[other] = await event_log.commit(other, [created(other) if other not in heads else dispatched(i)],
                                              expected_lsn=heads.get(other, 0))

    async def fetched_by(read: object) -> int:
        before = reader_nc.stats["in_msgs"]
        await read
        return reader_nc.stats["in_msgs"] - before

    first = await reader.first_lsn("r-me")
    assert first is not None
    cost = await fetched_by(reader.read("r-me"))
    assert n_mine <= cost <= n_mine + 2, "the run's commits, plus at most one end-of-batch status per batch"
    # a pinned read may over-fetch the run's own later commits (one batch at most), never other runs'
    pinned_cost = await fetched_by(reader.read("r-me", upto_lsn=first + 20))
    assert pinned_cost <= DIRECT_GET_BATCH + 1

    # many more commits of other runs, before, between and after: the read fetches exactly as much
    for i in range(600):
        other = f"r-late{i % 5}"
        heads[other] = await event_log.commit(other, [created(other) if other not in heads else dispatched(i)],
                                              expected_lsn=heads.get(other, 0))
    assert await fetched_by(reader.read("r-me")) == cost
    assert len(await reader.read("r-me")) == n_mine
    assert await fetched_by(reader.read("r-me", upto_lsn=first + 20)) == pinned_cost
    assert await fetched_by(reader.head("r-me")) == 1
    assert await fetched_by(reader.first_lsn("r-me")) == 1


# ---- infrastructure ------------------------------------------------------------------------------


async def test_ensure_infra_is_idempotent_and_keeps_data(cfg: Config, infra: Infra, event_log: JetStreamEventLog
                                                       ) -> None:
    lsn = await event_log.commit("r-i", [created("r-i")], expected_lsn=0)
    ref = await infra.blobs.put("k", b"blob")
    before = await infra.js.stream_info(cfg.names.events_stream)
    again = await ensure_infra(infra.nc, cfg)
    after = await infra.js.stream_info(cfg.names.events_stream)
    assert after.config == before.config
    assert after.state.messages == before.state.messages
    assert [n for n, _ in await event_log.read("r-i")] == [lsn]
    assert (await again.blobs.get("k")).data == b"blob" and ref.size == 4
    await again.leases.put("k", b"v")
    assert (await infra.leases.get("k")).value == b"v"


async def test_ensure_infra_repairs_a_drifted_stream_config(cfg: Config, infra: Infra) -> None:
    name = cfg.names.events_stream
    drifted = (await infra.js.stream_info(name)).config
    drifted.description = "someone edited this"
    drifted.duplicate_window = 5.0
    drifted.max_msgs_per_subject = 1000
    await infra.js.update_stream(drifted)
    assert (await infra.js.stream_info(name)).config.description == "someone edited this"
    await ensure_infra(infra.nc, cfg)
    fixed = (await infra.js.stream_info(name)).config
    assert fixed.description and fixed.description.startswith("Reel run events")
    assert fixed.duplicate_window == 120.0
    assert fixed.max_msgs_per_subject in (None, -1)
    assert fixed.allow_direct is True


async def test_ensure_infra_concurrently_on_a_fresh_namespace(cfg: Config, infra: Infra) -> None:
    fresh = Config(nats_url=cfg.nats_url, names=Names(cfg.names.namespace + "f"), storage="memory")
    results = await asyncio.gather(*(ensure_infra(infra.nc, fresh) for _ in range(4)))
    assert len(results) == 4
    info = await infra.js.stream_info(fresh.names.events_stream)
    assert info.config.storage == jsapi.StorageType.MEMORY
    log = JetStreamEventLog(infra.nc, fresh.names)
    assert await log.commit("r-1", [created("r-1")], expected_lsn=0) == 1
    await results[3].blobs.put("x", b"y")
    assert (await results[0].blobs.get("x")).data == b"y"
    for stream in (fresh.names.events_stream, fresh.names.commands_stream, fresh.names.verdicts_stream,
                   f"OBJ_{fresh.names.blob_bucket}", f"KV_{fresh.names.lease_bucket}",
                   f"KV_{fresh.names.outcome_bucket}"):
        await infra.js.delete_stream(stream)
