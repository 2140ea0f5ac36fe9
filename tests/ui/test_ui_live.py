"""``reel ui`` live, and escaped: a run waiting for approval is open in the browser; approving it from the
command line moves the page (new commits in the live log, the request answered, the run completed) with no
reload, by deltas (a step that was over keeps its element; the whole body is never fetched again); markup in
a tool's arguments and output, and in the approver's name, shows as text and never runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reel.services.timeline.render import open_requests
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.ui.support import REPO, artifact, chromium, env_for, reel, reel_ui, screenshot, until

pytestmark = pytest.mark.ui

WORKFLOW = Path(__file__).parent / "hostile.yaml"
OUTPUT = "<script>window.__pwned=1</script>deployed"
ARGS = '{"env":"<img src=x onerror=\\"window.__pwned=1\\">"}'
BY = "<i>ops</i>"


async def test_a_run_moves_live_and_markup_stays_text(cfg, event_log: JetStreamEventLog,  # type: ignore[no-untyped-def]
                                                     tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", str(WORKFLOW.relative_to(REPO)), "-q", env=env)
    assert code == 6, (out, err)  # awaiting input
    run_id = re.search(r"run (r-[0-9a-f]{20}) created", out).group(1)  # type: ignore[union-attr]
    waiting = await event_log.load(run_id)
    (request,) = open_requests(waiting)
    async with reel_ui(cfg, env=env) as url:
        with chromium(tmp_path / "profile") as b:
            b.get(url + "/")
            await until(b, lambda d: d.find_element(By.ID, "live-runs").get_attribute("data-live") == "1",
                        "the runs page's live connection")
            row = b.find_element(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]')
            assert row.get_attribute("data-status") == "awaiting_input"
            # a second tab on the run; the first keeps the runs page
            runs_tab = b.current_window_handle
            b.switch_to.new_window("tab")
            b.get(f"{url}/runs/{run_id}")
            await until(b, lambda d: d.find_element(By.ID, "live-state").get_attribute("data-live") == "1",
                        "the run page's live connection")
            assert b.find_element(By.ID, "run-status").text == "awaiting_input"
            req = b.find_element(By.CSS_SELECTOR, f'.input[data-request="{request["request_id"]}"]')
            assert req.get_attribute("data-request-status") == "open"
            assert f"reel approve {run_id} {request['request_id']}" in req.text
            assert b.find_element(By.CSS_SELECTOR, 'article[data-step="ship:t1:c0"] pre.tool-args').text == ARGS
            assert not b.find_elements(By.CSS_SELECTOR, "#live-log li")

            # a step that is over: the updates to come leave its element alone (they send only what changed)
            kept = b.execute_script("const a = [...document.querySelectorAll('article.step')].find("
                                    "e => e.dataset.status === 'succeeded'); a.__kept = 1; return a.id")
            code, out, err = await reel(cfg, "approve", run_id, request["request_id"], "--by", BY, env=env)
            assert code == 0, (out, err)
            done = await event_log.load(run_id)
            assert done.status == "completed" and done.head_lsn > waiting.head_lsn

            # the page moved by itself: every new commit in the live log, the body re-rendered at the new head
            await until(b, lambda d: d.find_element(By.ID, "run-status").text == "completed", "the run completed")
            lsns = [int(li.get_attribute("data-lsn")) for li in b.find_elements(By.CSS_SELECTOR, "#live-log li")]
            new = [lsn for lsn, _ in await event_log.read(run_id, from_lsn=waiting.head_lsn + 1)]
            assert lsns == new and lsns[-1] == done.head_lsn, (lsns, new)
            assert b.find_element(By.ID, "run-head").get_attribute("data-head") == str(done.head_lsn)
            assert b.execute_script("return document.getElementById(arguments[0]).__kept", kept) == 1, kept
            fetched = b.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
            assert any("/delta?since=" in u for u in fetched), fetched
            assert not any(u.split("?")[0].endswith("/body") for u in fetched), fetched  # never the whole body
            assert b.find_element(By.ID, "run").get_attribute("data-last-update") == "delta"
            answered = b.find_element(By.CSS_SELECTOR, f'.input[data-request="{request["request_id"]}"]')
            assert answered.get_attribute("data-request-status") == "approved"
            assert f"approved by {BY} at lsn" in answered.text
            tool = b.find_element(By.CSS_SELECTOR, 'div.attempt[data-step="ship:t1:c0"]')
            assert tool.get_attribute("data-status") == "succeeded"
            viewer = tool.find_element(By.CSS_SELECTOR, '.viewer[data-kind="result"]')
            viewer.find_element(By.TAG_NAME, "summary").click()
            pre = viewer.find_element(By.CSS_SELECTOR, "pre.blob-text")
            await until(b, lambda d: pre.text == OUTPUT, "the tool's output, as text")
            for inline in b.find_elements(By.CSS_SELECTOR, "pre.tool-result"):
                assert inline.text == OUTPUT
            # no markup from the run became an element, and none ran
            assert b.execute_script("return window.__pwned") is None
            assert not b.find_elements(By.CSS_SELECTOR, "#run-body script, #run-body img, #run-body i, "
                                                        "#live-log *:not(li)")
            assert any(OUTPUT in li.text or BY in li.text for li in b.find_elements(By.CSS_SELECTOR, "#live-log li"))
            screenshot(b, artifact(tmp_path, "ui-live-run.png"))

            b.switch_to.window(runs_tab)  # the runs page's row followed the run too
            await until(b, lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]').get_attribute(
                "data-status") == "completed", "the row updated live")
            assert b.execute_script("return window.__pwned") is None
