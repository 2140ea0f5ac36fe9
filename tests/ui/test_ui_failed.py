"""``reel ui`` puts failures first, in a real browser: a run whose step failed for good shows one badge (its
``failed`` outcome; ``completed`` as plain text, never a green badge beside it), the runs page's ``failed`` filter
lists it and not a passing run, search covers attempts' error text, and the run page opens with a failure
summary (the step, its last failed attempt, the error) whose link jumps to that attempt's anchor."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from reel.shared.nats.eventlog import JetStreamEventLog
from tests.ui.support import artifact, chromium, env_for, reel, reel_ui, screenshot, until

pytestmark = pytest.mark.ui

FAILING = "tests/ui/failing.yaml"
ERROR = "context_overflow: prompt is 9000 tokens, the window 8192 (scripted)"


def _ids(html: str) -> set[str]:
    return set(re.findall(r'<tr data-run="(r-[0-9a-f]{20})"', html))


async def test_a_failed_run_is_shown_first(cfg, event_log: JetStreamEventLog,  # type: ignore[no-untyped-def]
                                           tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    created = []
    for workflow, exit_code in ((FAILING, 3), ("examples/hello.yaml", 0)):  # 3: the run failed
        code, out, err = await reel(cfg, "run", workflow, "-q", env=env)
        assert code == exit_code, (workflow, code, out, err)
        created.append(re.search(r"run (r-[0-9a-f]{20}) created", out).group(1))  # type: ignore[union-attr]
    failed, passed = created
    state = await event_log.load(failed)
    assert (str(state.status), state.outcome) == ("completed", "failed")
    attempts = state.branches["main"].attempts["summarize"]
    assert [a.status for a in attempts] == ["failed", "failed"], attempts
    assert (await event_log.load(passed)).outcome == "passed"

    async with reel_ui(cfg, env=env) as url:
        async with aiohttp.ClientSession() as http:
            async def page(path: str) -> str:
                async with http.get(url + path) as r:
                    assert r.status == 200, path
                    return await r.text()

            assert _ids(await page("/")) == {failed, passed}
            assert _ids(await page("/?status=failed")) == {failed}
            assert _ids(await page("/?status=completed")) == {failed, passed}
            assert _ids(await page("/?q=" + quote("WINDOW 8192"))) == {failed}  # an error's text
            assert _ids(await page("/?q=429")) == {failed, passed}  # hello's summarize retried after a 429
            assert _ids(await page("/?status=failed&q=429")) == {failed}
            async with http.get(f"{url}/runs/{passed}/row?status=failed") as r:
                assert await r.json() == {"run_id": passed, "remove": True}
            async with http.get(f"{url}/runs/{failed}/row?status=failed") as r:
                row = await r.json()
            assert row["run_id"] == failed and 'data-failed="1"' in row["html"]

        with chromium(tmp_path / "profile") as b:
            b.get(url + "/?status=failed")
            row_el = b.find_element(By.CSS_SELECTOR, f'tr[data-run="{failed}"]')
            badges = [e.text for e in row_el.find_elements(By.CSS_SELECTOR, ".badge")]
            assert badges == ["failed"], badges  # one badge: no green `completed` beside the red outcome
            assert row_el.find_element(By.CSS_SELECTOR, "td.status").text == "completed"
            assert b.find_element(By.ID, "f-status").get_attribute("value") == "failed"
            row_el.find_element(By.LINK_TEXT, failed).click()

            await until(b, lambda d: d.find_element(By.ID, "run-id").text == failed, "the failed run's page")
            head = b.find_element(By.ID, "run-head")
            assert [e.text for e in head.find_elements(By.CSS_SELECTOR, ".facts .badge")] == ["failed"]
            summary = b.find_element(By.ID, "failure")
            assert (summary.get_attribute("data-step"), summary.get_attribute("data-attempt")) == ("summarize", "2")
            assert "failed at step summarize, attempt #2" in summary.text
            assert summary.find_element(By.CSS_SELECTOR, "pre.failure-error").text == ERROR
            # the summary comes before the timeline, and its link lands on the failed attempt
            assert b.execute_script("return arguments[0].compareDocumentPosition(document.getElementById("
                                    "'timeline')) & Node.DOCUMENT_POSITION_FOLLOWING", summary)
            link = b.find_element(By.ID, "jump-failed")
            assert link.get_attribute("href").endswith("#attempt-summarize-2")
            screenshot(b, artifact(tmp_path, "ui-failed-run.png"))
            b.set_window_size(1300, 600)
            link.click()
            await until(b, lambda d: d.execute_script("return location.hash") == "#attempt-summarize-2",
                        "the jump")
            target = b.find_element(By.ID, "attempt-summarize-2")
            assert (target.get_attribute("data-step"), target.get_attribute("data-attempt"),
                    target.get_attribute("data-status")) == ("summarize", "2", "failed")
            assert b.execute_script("return document.querySelector(':target') === arguments[0]", target)
            top, bottom, height = b.execute_script(
                "const r = arguments[0].getBoundingClientRect(); return [r.top, r.bottom, innerHeight]", target)
            assert -1 <= top < bottom <= height + 1, (top, bottom, height)  # scrolled to it
            assert ERROR in target.find_element(By.CSS_SELECTOR, ".attempt-error").text
            for step in ("plan", "summarize"):
                assert b.find_element(By.ID, f"step-{step}").get_attribute("data-step") == step
