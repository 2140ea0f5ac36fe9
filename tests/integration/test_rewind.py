"""Rewind service on a real nats-server: forks at a step and at an LSN, idempotency, resume, bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path

from reel.services.executor.app import serve as executor_serve
from reel.services.rewind.app import serve as rewind_serve
from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    BranchForked,
    RunCancelled,
    RunStarted,
)
from reel.shared.core.run.ids import branch_id_for_key
from reel.shared.core.run.statecodec import STATE_ENCODER
from reel.shared.core.run.views import build_episode_view, serialize_view
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.scenarios import (
    attempt_of,
    commit_events,
    create_manual_run,
    head_lsn,
    wait_state,
    wait_until,
)
from tests.refold import assert_refold_identical

_enc = STATE_ENCODER


def three_steps() -> WorkflowSpec:
    return parse_workflow({"name": "abc", "steps": [
        {"kind": "tool", "id": "a", "tool": {"type": "scripted", "outputs": ["A"]}},
        {"kind": "model", "id": "b", "model": {"adapter": "scripted", "outputs": ["B"]},
         "context": [{"id": "out-a", "from_step": "a", "kind": "output"}]},
        {"kind": "tool", "id": "c", "tool": {"type": "scripted", "outputs": ["C"]}},
    ]})


async def forks(event_log: JetStreamEventLog, run_id: str) -> list[BranchForked]:
    return [e for _, c in await event_log.read(run_id) for e in c.events if isinstance(e, BranchForked)]


async def test_rewind_at_step_forks_a_new_branch_and_execution_resumes_on_it(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg):
        start = await client.start(three_steps())
        assert start.run_id
        run = start.run_id
        done = await client.wait_for(run, ("verifying",), timeout_s=30)
        main_before = _enc.encode(done.branches["main"])
        view_before = serialize_view(build_episode_view(done))
        lsns = [lsn for lsn, _ in await event_log.read(run)]

        reply = await client.rewind(run, at_step="b", idempotency_key="try-b-again")
        assert reply.ok and reply.created and reply.status == "running", reply
        assert reply.detail["resume"] == "published"  # the run rested: an executor must pick it up
        new = branch_id_for_key(run, "try-b-again")
        assert reply.branch_id == new and reply.lsn > done.head_lsn
        state = await wait_state(event_log, run, lambda s: s.status == "verifying" and s.verifying_branch == new,
                                 what="the resumed run to reach verifying on the new branch")

        # a repeated rewind (same key) answers with the same branch and commits nothing
        head = state.head_lsn
        again = await client.rewind(run, at_step="b", idempotency_key="try-b-again")
        assert again.ok and again.created is False and (again.branch_id, again.lsn) == (new, reply.lsn), again
        assert await head_lsn(event_log, run) == head and len(await forks(event_log, run)) == 1

    branch = state.branches[new]
    b1_main = attempt_of(done, "b", 1, "main")
    assert (branch.parent_branch_id, branch.from_step, branch.created_lsn) == ("main", "b", reply.lsn)
    # at the commit of b's first try, which also recorded a's outcome (one round trip per step): a's outcome
    # is inherited, b's intent is not (from_step)
    assert branch.fork_lsn == b1_main.dispatched_lsn == attempt_of(done, "a", 1, "main").outcome_lsn
    assert lsns.index(b1_main.dispatched_lsn) > 0
    assert branch.attempts["a"] == done.branches["main"].attempts["a"]  # inherited as they were
    assert all(attempt_of(state, s, 1, new).dispatched_lsn > reply.lsn for s in ("b", "c"))  # re-executed
    assert _enc.encode(state.branches["main"]) == main_before  # the parent's records never change
    pinned = await event_log.load(run, upto_lsn=done.verifying_lsn)
    assert serialize_view(build_episode_view(pinned)) == view_before  # a held view of the old branch
    view = build_episode_view(state)
    assert [b.branch_id for b in view.lineage] == ["main", new]
    await assert_refold_identical(event_log, state)


async def test_rewind_at_lsn_of_a_named_branch(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg):
        start = await client.start(three_steps())
        assert start.run_id
        run = start.run_id
        done = await client.wait_for(run, ("verifying",), timeout_s=30)
        first = await client.rewind(run, at_step="c")
        assert first.ok and first.branch_id
        await wait_state(event_log, run, lambda s: s.status == "verifying" and s.verifying_branch == first.branch_id)

        a_done = attempt_of(done, "a", 1, "main").outcome_lsn  # fork `main` (no longer active) after step a
        assert a_done is not None
        reply = await client.rewind(run, branch="main", at_lsn=a_done)
        assert reply.ok and reply.created and reply.branch_id not in (None, first.branch_id), reply
        new = reply.branch_id
        assert new is not None
        state = await wait_state(event_log, run, lambda s: s.status == "verifying" and s.verifying_branch == new)
        # the two branches are siblings (both forked from main): neither may be rewound at the other's commits
        for target, sibling in ((first.branch_id, new), (new, first.branch_id)):
            theirs = attempt_of(state, "c", 1, sibling).dispatched_lsn
            refused = await client.rewind(run, branch=target, at_lsn=theirs)
            assert refused.ok is False and refused.error is not None, refused
            assert refused.error.code == "lsn_not_in_lineage", refused.error
            assert f"a commit of branch '{sibling}', not on the lineage of branch '{target}'" in refused.error.message
        assert len(await forks(event_log, run)) == 2, "nothing committed by a refused rewind"
    branch = state.branches[new]
    assert (branch.parent_branch_id, branch.fork_lsn, branch.from_step) == ("main", a_done, None)
    assert branch.attempts["a"] == done.branches["main"].attempts["a"]
    # a's outcome and b's first intent share a commit (one round trip per step): the fork inherits b#1 in
    # flight, and the executor supersedes it with b#2 after the fork
    b1, b2 = attempt_of(state, "b", 1, new), attempt_of(state, "b", 2, new)
    assert (b1.status, b1.dispatched_lsn) == ("dispatched", a_done)
    assert b2.status == "succeeded" and b2.dispatched_lsn > reply.lsn
    assert len(await forks(event_log, run)) == 2
    await assert_refold_identical(event_log, state)


async def test_rewind_of_a_running_run_is_continued_by_its_own_executor(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path
) -> None:
    """The driving executor moves to the new branch by itself; no second drive loop, no duplicate attempts."""
    started, gate = tmp_path / "started", tmp_path / "gate"
    spec = parse_workflow({"name": "gated", "steps": [
        {"kind": "tool", "id": "slow", "tool": {"type": "command", "argv": [
            "sh", "-c", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done; echo slow"]}},
        {"kind": "tool", "id": "next", "tool": {"type": "command", "argv": ["sh", "-c", "sleep 0.2; echo next"]}},
    ]})
    async with running(executor_serve, infra, cfg), running(rewind_serve, infra, cfg):
        start = await client.start(spec)
        assert start.run_id
        run = start.run_id
        await wait_until(lambda: asyncio.to_thread(started.exists), timeout_s=30, what="the slow tool to start")
        reply = await client.rewind(run, at_step="slow")
        assert reply.ok and reply.branch_id, reply
        gate.touch()
        state = await wait_state(event_log, run, lambda s: s.status == "verifying", timeout_s=30)
    new = state.branches[reply.branch_id]
    assert state.verifying_branch == reply.branch_id
    assert {s: [(a.attempt, a.status) for a in atts] for s, atts in new.attempts.items()} == {
        "slow": [(1, "succeeded")], "next": [(1, "succeeded")]}
    # the side effect on main happened: its outcome is recorded on main (above the fork), main is not driven on
    old = attempt_of(state, "slow", 1, "main")
    assert old.status == "succeeded" and old.outcome_lsn is not None and old.outcome_lsn > reply.lsn
    assert "next" not in state.branches["main"].attempts
    assert reply.detail["resume"] == "owner_driving"


async def test_rewind_bad_input_is_refused_without_a_commit(
    infra: Infra, cfg: Config, client: ReelClient, event_log: JetStreamEventLog
) -> None:
    run, other = "r-target", "r-other"
    await create_manual_run(event_log, run, [("s1", 1), ("s2", 1)])
    other_lsn = await create_manual_run(event_log, other, [("s1", 1)])
    started = await commit_events(event_log, run, RunStarted(executor_id="x-1", at_ms=1))
    dispatched = await commit_events(event_log, run, AttemptDispatched(branch_id="main", step_id="s1", attempt=1,
                                                                       executor_id="x-1", at_ms=2))
    await commit_events(event_log, run, AttemptSucceeded(branch_id="main", step_id="s1", attempt=1, at_ms=3,
                                                         output_ref=BlobRef(sha256="1" * 64, size_bytes=1)))
    head = await head_lsn(event_log, run)
    assert other_lsn < head  # below the head: only lineage membership can refuse it

    async def refused(body: bytes, code: str) -> None:
        before = await head_lsn(event_log, run)
        reply = await client.command("rewind", body, timeout_s=15)
        assert not reply.ok and reply.error is not None, (body, reply)
        assert reply.error.code == code and reply.error.message, (body, reply)
        assert await head_lsn(event_log, run) == before, body

    async with running(rewind_serve, infra, cfg):
        for body, code in [
            (b"{not json", "invalid_command"),
            (b"", "invalid_command"),
            (b'{"run_id": "r-target", "at_lsn": "three"}', "invalid_command"),
            (b'{"run_id": "r-target", "at_step": "s1", "depth": 2}', "invalid_command"),
            (b'{"run_id": "r-tar.get", "at_step": "s1"}', "invalid_command"),
            (b'{"run_id": "r-target"}', "invalid_command"),
            (b'{"run_id": "r-target", "at_step": "s1", "at_lsn": 1}', "invalid_command"),
            (b'{"run_id": "r-never-existed", "at_step": "s1"}', "run_not_found"),
            (b'{"run_id": "r-target", "branch": "nope", "at_step": "s1"}', "branch_not_found"),
            (b'{"run_id": "r-target", "at_step": "s9"}', "step_not_found"),
            (f'{{"run_id": "r-target", "at_lsn": {other_lsn}}}'.encode(), "lsn_not_in_lineage"),
            (f'{{"run_id": "r-target", "at_lsn": {head + 1000}}}'.encode(), "lsn_not_in_lineage"),
            (b'{"run_id": "r-target", "at_lsn": 0}', "lsn_not_in_lineage"),
        ]:
            await refused(body, code)

        ok = await client.rewind(run, at_lsn=started, idempotency_key="k")  # still up; a valid rewind works
        assert ok.ok and ok.created and ok.branch_id, ok
        # the same key with another fork point is refused, not silently answered with the old branch
        await refused(b'{"run_id": "r-target", "at_lsn": %d, "idempotency_key": "k"}' % dispatched,
                      "idempotency_key_reused")
        # between the new branch's fork point and its creation it did not exist
        await refused(b'{"run_id": "r-target", "branch": "%s", "at_lsn": %d}' % (ok.branch_id.encode(), dispatched),
                      "lsn_not_in_lineage")
        await commit_events(event_log, run, RunCancelled(reason="stop", at_ms=9))
        await refused(b'{"run_id": "r-target", "at_step": "s2"}', "invalid_transition")
    assert len(await forks(event_log, run)) == 1
