"""``reel fork`` and ``reel compare`` on the agent example, as a user runs them (the ``reel`` command in a real
process, an executor and a verifier in this one, the real server)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from reel.shared.core.agent.forkcontext import DROPPED_BY_FORK
from reel.shared.core.run.events import BranchForked
from reel.shared.core.run.forkedits import Drop, Restore
from reel.shared.core.run.state import RunState, RunStatus
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config
from tests.integration.test_cli import reel

RESTING = (RunStatus.COMPLETED, RunStatus.CANCELLED)


async def _settled(client: ReelClient, run_id: str, branch: str) -> RunState:
    """The run once it rests on ``branch`` (the fork's branch driven to its verdict)."""
    async def wait() -> RunState:
        async for state in client.watch(run_id):
            if state.active_branch == branch and state.status in RESTING:
                return state
        raise AssertionError("watch ended")
    return await asyncio.wait_for(wait(), 120)


async def _agent_run(cfg: Config) -> str:
    code, out, err = await reel(cfg, "run", "examples/agent/fix_typo.yaml", "-q")
    assert code == 0, (out, err)
    return re.search(r"run (r-[0-9a-f]{20})", out).group(1)  # type: ignore[union-attr]


async def _fork(cfg: Config, run_id: str, *args: str) -> str:
    code, out, err = await reel(cfg, "fork", run_id, "--at", "fix:t1", *args)
    assert code == 0, (out, err)
    branch = out.strip()
    assert re.fullmatch(r"b-[0-9a-f]{12}", branch), out  # the new branch id, whole, alone on stdout
    return branch


@pytest.mark.usefixtures("executor", "verifier")
async def test_fork_restore_changes_the_forked_turns_packed_set(cfg: Config, event_log: JetStreamEventLog,
                                                                client: ReelClient) -> None:
    run_id = await _agent_run(cfg)
    main = (await event_log.load(run_id)).branches["main"]
    before = main.attempts["fix:t1"][-1].context
    assert before is not None and "old-notes" in before.dropped and "old-notes" not in before.packed

    branch = await _fork(cfg, run_id, "--restore", "old-notes")
    state = await _settled(client, run_id, branch)
    after = state.branches[branch].attempts["fix:t1"][-1].context
    assert after is not None
    assert set(after.packed) == {*before.packed, "old-notes"} and "old-notes" not in after.dropped
    assert after.restored == ("old-notes",)  # the partition says why it is there
    assert state.branches["main"].attempts["fix:t1"][-1].context == before  # the parent's records never change
    # later turns pack by policy again: the restore was for the forked turn
    t2 = state.branches[branch].attempts["fix:t2"][-1].context
    assert t2 is not None and "old-notes" in t2.dropped
    forks = [e for _, c in await event_log.read(run_id) for e in c.events if isinstance(e, BranchForked)]
    assert [(f.branch_id, f.from_step, f.edits) for f in forks] == [
        (branch, "fix:t1", (Restore(item="old-notes"),))]  # the edit is in the log

    code, out, err = await reel(cfg, "show", run_id, "--branch", branch)
    assert code == 0 and "fix:t1#1 restored by fork: old-notes" in out, (out, err)

    # a drop: the item leaves the turn, with the reason recorded
    dropped = await _fork(cfg, run_id, "--drop", "layout", "--branch", "main")
    state = await _settled(client, run_id, dropped)
    part = state.branches[dropped].attempts["fix:t1"][-1].context
    assert part is not None and "layout" not in part.packed
    assert dict(part.dropped_with_reasons())["layout"] == DROPPED_BY_FORK
    forks = [e for _, c in await event_log.read(run_id) for e in c.events if isinstance(e, BranchForked)]
    assert forks[-1].edits == (Drop(item="layout"),)
    code, out, err = await reel(cfg, "show", run_id, "--branch", dropped)
    assert code == 0 and "layout (dropped_by_fork)" in out, (out, err)

    # an edit that does not fit the turn is refused, and nothing is committed
    head = state.head_lsn
    code, out, err = await reel(cfg, "fork", run_id, "--at", "fix:t1", "--restore", "task", "--json")
    assert code == 1 and "invalid_edit" in err and "packed in turn fix:t1 already" in err, (out, err)
    assert json.loads(out.strip().splitlines()[-1])["code"] == "invalid_edit"
    assert (await event_log.load(run_id)).head_lsn == head

    # three branches side by side: every branch id whole, the verdicts, the usage, where they diverge, the
    # partition diff at the fork, the output diff
    code, out, err = await reel(cfg, "compare", run_id)
    assert code == 0, (out, err)
    for b in ("main", branch, dropped):
        assert b in out
    assert re.search(r"\btests-pass\b", out) and "turns" in out and "cost $" in out, out
    assert f"{branch} vs main: first differs at fix:t1 (prompt)" in out, out
    assert "partition of fix:t1: packed +[old-notes] -[], restored [old-notes]" in out, out
    assert "partition of fix:t1: packed +[] -[layout], dropped by fork [layout]" in out, out
    assert "restore old-notes" in out and "drop layout" in out
    code, out, err = await reel(cfg, "compare", run_id, "--json")
    assert code == 0, (out, err)
    found = json.loads(out)
    assert found["baseline"] == "main" and [b["branch_id"] for b in found["branches"]] == ["main", branch, dropped]
    rows = {b["branch_id"]: b for b in found["branches"]}
    assert all(r["verdicts"].get("tests-pass") in ("pass", "fail") and r["turns"] >= 1 for r in rows.values())
    assert rows[branch]["edits"] == [{"edit": "restore", "item": "old-notes"}] and rows[dropped]["active"]
    assert [d["step_id"] for d in found["divergences"]] == ["fix:t1", "fix:t1"]
    # the example keeps a workspace per branch: each fork's files at its head against main's
    assert set(found["workspaces"]) == {branch, dropped}
    assert all(isinstance(d, str) for d in found["workspaces"].values())
    code, out, err = await reel(cfg, "compare", run_id, dropped, branch)  # a baseline of one's choosing
    assert code == 0 and f"baseline {dropped}" in out, (out, err)
    code, out, err = await reel(cfg, "compare", run_id, "b-nope")
    assert code == 1 and "branch_not_found" in err, (out, err)
