"""``reel ui`` puts two branches of a run side by side, in a real browser: a fork of the agent example that puts
back the item its first turn dropped, beside the branch it came from — each branch's edits, verdicts, turns,
tokens and cost, where it first differs, its fork turn's partition diff and its final output."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from reel.shared.core.run.state import RunState, RunStatus
from reel.shared.nats.client import ReelClient
from reel.shared.runtime.config import Config
from tests.ui.support import chromium, env_for, reel, reel_ui, until

pytestmark = pytest.mark.ui


async def _settled(client: ReelClient, run_id: str, branch: str) -> RunState:
    async def wait() -> RunState:
        async for state in client.watch(run_id):
            if state.active_branch == branch and state.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
                return state
        raise AssertionError("watch ended")
    return await asyncio.wait_for(wait(), 120)


@pytest.mark.usefixtures("executor", "verifier")
async def test_two_branches_side_by_side(cfg: Config, client: ReelClient, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", "examples/agent/fix_typo.yaml", "-q", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20})", out).group(1)  # type: ignore[union-attr]
    code, out, err = await reel(cfg, "fork", run_id, "--at", "fix:t1", "--restore", "old-notes", env=env)
    assert code == 0, (out, err)
    fork = out.strip()
    state = await _settled(client, run_id, fork)
    verdicts = {b: {v.verifier: str(v.status) for v in state.verdicts if v.branch_id == b} for b in ("main", fork)}
    async with reel_ui(cfg, env=env) as url:
        with chromium(tmp_path / "profile") as b:
            b.get(f"{url}/runs/{run_id}")
            b.find_element(By.ID, "compare-branches").click()
            await until(b, lambda d: d.find_elements(By.ID, "compare"), "the compare page")
            heads = [th.get_attribute("data-branch") for th in b.find_elements(By.CSS_SELECTOR, "#compare th.branch")]
            assert heads == ["main", fork]  # every branch, the root first (the baseline)

            def row(name: str) -> list[str]:
                tr = b.find_element(By.CSS_SELECTOR, f'#compare tr[data-row="{name}"]')
                return [td.text for td in tr.find_elements(By.TAG_NAME, "td")]

            assert row("edits") == ["none", "restore old-notes"]
            assert row("forked")[0] == "root" and row("forked")[1] == "from main at fix:t1"
            part = row("partition")
            assert part[0] == "—" and "restored by fork: old-notes" in part[1] and "packed +old-notes" in part[1]
            assert row("divergence")[1] == "at fix:t1 (prompt)"
            for tr in b.find_elements(By.CSS_SELECTOR, '#compare tr[data-row="verdict"]'):
                v = tr.get_attribute("data-verifier")
                assert [td.text for td in tr.find_elements(By.TAG_NAME, "td")] == [
                    verdicts["main"].get(v, "—"), verdicts[fork].get(v, "—")]
            turns = [int(t) for t in row("turns")]
            assert turns == [len(state.branches[x].agents["fix"].turns) for x in ("main", fork)]
            outputs = row("output")
            assert all(o and o != "none yet" for o in outputs)
            assert row("output-diff")[0] == "—" and row("output-diff")[1]
            ws = row("workspace-diff")  # the example keeps a workspace per branch
            assert ws[0] == "—" and ws[1]

            b.get(f"{url}/runs/{run_id}/compare?branch={fork}&branch=main")  # a baseline of one's choosing
            heads = [th.get_attribute("data-branch") for th in b.find_elements(By.CSS_SELECTOR, "#compare th.branch")]
            assert heads == [fork, "main"]
            b.get(f"{url}/runs/{run_id}/compare?branch=b-nope")
            assert "has no branch 'b-nope'" in b.find_element(By.TAG_NAME, "body").text
