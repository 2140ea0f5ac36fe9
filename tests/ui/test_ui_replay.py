"""``reel ui`` in a real browser on a replayed recording (``reel replay`` of a tau-bench episode from ../shared/data):
the run is listed with its replay label, every recorded turn and tool call is on the timeline with its partition,
the verdicts with their snapshot LSNs; a rewind made while the page is open appears live as a second branch on
the lineage graph."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reel.shared.core.run.views import build_episode_view
from reel.shared.core.verify.verification import checks_summary, context_checks, reported_outcome
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.ui.support import artifact, chromium, env_for, reel, reel_ui, screenshot, until

pytestmark = [pytest.mark.ui, pytest.mark.data]

TAU = "taubench_gpt-4o-airline.json"


async def test_a_replayed_run_in_the_browser(cfg, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,  # type: ignore[no-untyped-def]
                                             data_dir: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "replay", str(data_dir / TAU), "--limit", "1", "--no-timelines", env=env,
                                timeout_s=240)
    run_id = re.search(r"run (r-[0-9a-f]{20})", out).group(1)  # type: ignore[union-attr]
    state = await event_log.load(run_id)
    assert state.status == "completed" and code in (0, 3), (code, out, err)
    view = build_episode_view(state)
    turns = [s for s in view.steps if s.kind == "model"]
    calls = [s for s in view.steps if s.kind == "tool"]
    assert len(turns) > 2 and calls
    async with reel_ui(cfg, "--page-bytes", "4096", env=env) as url:
        with chromium(tmp_path / "profile") as b:
            b.get(f"{url}/?q={TAU}")  # the replay label is searchable
            row = b.find_element(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]')
            assert row.get_attribute("data-status") == "completed"
            outcome, checks = reported_outcome(state) or "", checks_summary(state)
            assert checks and row.find_element(By.CSS_SELECTOR, "td.outcome").text == f"{outcome} {checks}"
            assert f"replayed_from={TAU}" in row.text
            b.find_element(By.LINK_TEXT, run_id).click()
            await until(b, lambda d: d.find_element(By.ID, "live-state").get_attribute("data-ended") == "1",
                        "the ended run's page following nothing")

            assert b.find_element(By.ID, "run-outcome").text == outcome  # as Reel reports it: not over its check
            assert b.find_element(By.ID, "run-checks").text.startswith(", ".join(context_checks(state)))
            steps = [e.get_attribute("data-step") for e in b.find_elements(By.CSS_SELECTOR, "article.step")]
            assert steps == [s.step_id for s in view.steps]
            for s in calls:
                el = b.find_element(By.CSS_SELECTOR, f'article.step[data-step="{s.step_id}"]')
                assert f"tool {s.tool_name}" in el.text and f"call id {s.call_id}" in el.text
            for s in turns:
                a = s.attempts[-1]
                el = b.find_element(By.CSS_SELECTOR,
                                    f'div.attempt[data-step="{a.step_id}"][data-attempt="{a.attempt}"]')
                assert el.get_attribute("data-dispatched-lsn") == str(a.dispatched_lsn)
                assert el.get_attribute("data-outcome-lsn") == str(a.outcome_lsn)
                assert a.context is not None and "instructions" in a.context.packed
                if el.find_elements(By.CSS_SELECTOR, ".partition .same-as"):  # only what changed: test_ui_read.py
                    now = {i.get_attribute("data-item") for i in el.find_elements(
                        By.CSS_SELECTOR, '.change[data-now="packed"] .item')}
                    assert now <= set(a.context.packed), (a.step_id, now)
                    continue
                packed = [i.get_attribute("data-item") for i in el.find_elements(
                    By.CSS_SELECTOR, '.group[data-group="packed"] .item')]
                assert packed == list(a.context.packed)
            for v in state.verdicts:
                vrow = b.find_element(By.CSS_SELECTOR, f'tr.verdict[data-verifier="{v.verifier}"]')
                assert (vrow.get_attribute("data-status"), vrow.get_attribute("data-snapshot-lsn"),
                        vrow.get_attribute("data-branch")) == (v.status, str(v.snapshot_lsn), v.branch_id)
                tagged = bool(vrow.find_elements(By.CSS_SELECTOR, ".context-check"))
                assert tagged == (v.verifier in context_checks(state)), v.verifier

            # the last turn's recorded prompt, fetched when opened: its first page is the body's first 4096 bytes
            last = turns[-1].attempts[-1]
            assert last.prompt_ref is not None
            prompt = (await blobs.get(last.prompt_ref)).decode()
            viewer = b.find_element(By.CSS_SELECTOR, f'.viewer[data-key="{last.step_id}#{last.attempt}:prompt"]')
            viewer.find_element(By.TAG_NAME, "summary").click()  # the recorded messages, as a conversation
            await until(b, lambda d: len(viewer.find_elements(By.CSS_SELECTOR, ".chat .msg")) == len(
                json.loads(prompt)["messages"]), "the prompt as a conversation")
            viewer.find_element(By.CSS_SELECTOR, "details.raw-bytes summary").click()  # and its bytes
            pre = viewer.find_element(By.CSS_SELECTOR, "pre.blob-text")
            await until(b, lambda d: viewer.get_attribute("data-loaded") == "1", "the prompt's first page")
            shown = b.execute_script("return arguments[0].textContent", pre)
            assert shown == prompt.encode()[:int(viewer.get_attribute("data-next"))].decode() and shown
            assert json.loads(prompt)["messages"]  # the wire request the recorded model answered

            # a rewind of the ended run: its page followed nothing; reloaded, the graph has the new branch's lane
            code, out, err = await reel(cfg, "rewind", run_id, "--at-step", turns[1].step_id, "--key", "ui", "--json",
                                        env=env)
            assert code == 0, (out, err)
            forked = json.loads(out.strip().splitlines()[-1])["branch_id"]
            after = await event_log.load(run_id)
            fork = after.branches[forked]
            assert b.find_element(By.ID, "run-head").get_attribute("data-head") != str(after.head_lsn)
            b.refresh()
            await until(b, lambda d: d.find_element(By.ID, "run-head").get_attribute("data-head") == str(
                after.head_lsn), "the page at the log's new head")
            # read in one script: a later commit's re-render cannot swap the body between two reads
            seen = b.execute_script(
                "const g = document.querySelector(`svg.lineage g.lane[data-branch='${arguments[0]}']`);"
                "return g && [g.dataset.parent, g.dataset.forkLsn, document.querySelectorAll("
                "'svg.lineage path.fork').length]", forked)
            assert seen is not None, "no lane for the new branch"
            parent, fork_lsn, curves = seen
            assert (parent, fork_lsn, curves) == ("main", str(fork.fork_lsn), 1)
            b.get(f"{url}/runs/{run_id}?branch=main")  # the original branch keeps its verdicts and attempts
            assert len(b.find_elements(By.CSS_SELECTOR, "div.attempt")) == len(list(view.attempts()))
            screenshot(b, artifact(tmp_path, "ui-replayed-run.png"))
