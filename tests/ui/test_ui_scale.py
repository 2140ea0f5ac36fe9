"""``reel ui`` at more runs than a page holds, in a real browser: 250 runs are three pages (100, 100, 50, newest
first) whose older/newer links name the same runs after 30 more arrive; page 1 takes new runs in live and stays at
100; label search matches ``team=infra`` as the page shows it and a label links to its filter; every row shows its
creation in local time (UTC on hover) and its duration; a copy button puts the run id on the clipboard; at 390 px
nothing is wider than the screen (runs page and a judged run's verdicts); a finished run without verifiers does
not say "no verdict yet"; the favicon is served."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from reel.services.ui.pages import duration, utc
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.ui.fakeruns import JUDGES, fill, judged
from tests.ui.support import artifact, chromium, env_for, reel_ui, screenshot, until

pytestmark = pytest.mark.ui

KOLKATA = timedelta(hours=5, minutes=30)  # the browser's time zone here: UTC+05:30, no daylight saving


def _shown(b: Any) -> list[str]:
    return list(b.execute_script("return [...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run)"))


def _range(b: Any) -> str:
    return str(b.execute_script("return document.querySelector('#pager-top .range').textContent"))


async def test_pages_timestamps_copy_and_a_narrow_screen(cfg, event_log: JetStreamEventLog,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    t0 = int(time.time() * 1000) - 3_600_000
    runs = await fill(event_log, 250, t0_ms=t0)
    ids = [r.run_id for r in reversed(runs)]  # newest first
    env = env_for(tmp_path)
    async with reel_ui(cfg, env=env) as url:
        with chromium(tmp_path / "profile") as b:
            b.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
            b.get(url + "/")
            assert _shown(b) == ids[:100] and _range(b) == "runs 1–100 of 250"
            b.find_element(By.CSS_SELECTOR, "#pager-bottom a.older").click()
            await until(b, lambda d: _range(d) == "runs 101–200 of 250", "page 2")
            assert _shown(b) == ids[100:200]
            page2 = b.current_url
            assert "before=" in page2

            more = await fill(event_log, 30, t0_ms=t0, start=250)  # newer runs arrive
            b.get(page2)
            await until(b, lambda d: _range(d) == "runs 131–230 of 280", "page 2 again")  # the page has loaded
            assert _shown(b) == ids[100:200]  # the same runs
            b.find_element(By.CSS_SELECTOR, "#pager-top a.older").click()
            await until(b, lambda d: _range(d) == "runs 231–280 of 280", "page 3")
            assert _shown(b) == ids[200:250] and not b.find_elements(By.CSS_SELECTOR, "#pager-top a.older")
            b.find_element(By.CSS_SELECTOR, "#pager-top a.newer").click()
            await until(b, lambda d: _range(d) == "runs 131–230 of 280", "back to page 2")
            assert _shown(b) == ids[100:200]
            b.find_element(By.CSS_SELECTOR, "#pager-top a.newer").click()
            await until(b, lambda d: _range(d) == "runs 31–130 of 280", "the page above it")
            assert _shown(b) == ids[:100]
            b.find_element(By.CSS_SELECTOR, "#pager-top a.newer").click()
            await until(b, lambda d: _range(d) == "runs 1–100 of 280", "the first page")
            newest = [r.run_id for r in reversed(more)]
            assert _shown(b) == newest + ids[:70]

            # page 1 takes new runs in, live, in their place, and stays one page long
            await until(b, lambda d: d.find_element(By.ID, "live-runs").get_attribute("data-live") == "1", "live")
            later = await fill(event_log, 3, t0_ms=t0, start=280)
            await until(b, lambda d: _shown(d)[:3] == [r.run_id for r in reversed(later)], "new runs in, live")
            assert _shown(b) == [r.run_id for r in reversed(later)] + newest + ids[:67]

            # timestamps: local time (the browser's zone), UTC on hover; durations of finished and running runs
            by_id = {r.run_id: (i, r) for i, r in enumerate([*runs, *more, *later])}
            for tr in b.find_elements(By.CSS_SELECTOR, "#runs tbody tr")[:16]:
                i, r = by_id[tr.get_attribute("data-run")]
                created = t0 + i
                ts = tr.find_element(By.CSS_SELECTOR, "td.created time.ts")
                local = datetime.fromtimestamp(created / 1000, tz=UTC) + KOLKATA
                assert ts.text == local.strftime("%Y-%m-%d %H:%M:%S"), (ts.text, local)
                assert ts.get_attribute("title") == utc(created) and utc(created).endswith(" UTC")
                dur = tr.find_element(By.CSS_SELECTOR, "td.duration").text
                if r.kind in ("passed", "retried", "failed"):
                    assert dur == duration(1000 + 500), (r.kind, dur)  # created → run_completed
                elif r.kind == "cancelled":
                    assert dur == duration(1000 + 160), (r.kind, dur)
                else:
                    assert dur.endswith("…") and re.fullmatch(r"1 h 0\d min…", dur), (r.kind, dur)  # still going

            # the copy button puts the run id on the clipboard
            b.execute_cdp_cmd("Browser.grantPermissions", {"origin": url, "permissions": [
                "clipboardReadWrite", "clipboardSanitizedWrite"]})
            first = b.find_element(By.CSS_SELECTOR, "#runs tbody tr")
            first.find_element(By.CSS_SELECTOR, "button.copy").click()
            await until(b, lambda d: first.find_element(By.CSS_SELECTOR, "button.copy").get_attribute(
                "data-copied") == "1", "copied")
            pasted = b.execute_async_script("navigator.clipboard.readText().then(arguments[0], "
                                            "e => arguments[0]('error: ' + e))")
            assert pasted == first.get_attribute("data-run")

            # label search as shown: `team=infra`, typed into the search box; a label links to its filter
            infra = {r.run_id for r in [*runs, *more, *later] if r.team == "infra"}
            box = b.find_element(By.ID, "f-q")
            box.clear()
            box.send_keys("team=infra")
            b.find_element(By.ID, "f-submit").click()
            await until(b, lambda d: "q=team%3Dinfra" in d.current_url, "the search")
            assert set(_shown(b)) == infra and _range(b) == f"runs 1–{len(infra)} of {len(infra)}"
            b.get(url + "/?q=" + quote("TEAM=ML"))
            assert {r.run_id for r in [*runs, *more, *later] if r.team == "ml"} == set(_shown(b))
            b.find_element(By.CSS_SELECTOR, "#runs tbody tr a.label[href*='team']").click()
            await until(b, lambda d: "label=team%3Dml" in d.current_url, "the label's filter")
            assert b.find_element(By.ID, "f-label").get_attribute("value") == "team=ml"
            assert len(_shown(b)) == 71 and _range(b) == "runs 1–71 of 71"  # 283 runs, every fourth from 1

            # 390 px wide: the runs page and a judged run's verdicts fit; nothing is clipped or scrolls sideways
            rid = await judged(event_log, t0_ms=t0)
            b.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844,
                                                                     "deviceScaleFactor": 1, "mobile": True})
            b.get(url + "/")
            assert b.execute_script("return innerWidth") == 390
            widths = b.execute_script(
                "const t = document.getElementById('runs'); const cells = [...t.querySelectorAll('td')];"
                "return [document.documentElement.scrollWidth, t.getBoundingClientRect().width,"
                " Math.max(...cells.map(c => c.getBoundingClientRect().right)),"
                " Math.max(...cells.map(c => c.scrollWidth - c.clientWidth))]")
            assert widths[0] <= 390 and widths[1] <= 390 and widths[2] <= 390 and widths[3] <= 0, widths
            screenshot_390(b, artifact(tmp_path, "ui-runs-390px.png"))
            b.get(f"{url}/runs/{rid}")
            rows = b.find_elements(By.CSS_SELECTOR, "tr.verdict")
            assert [r.get_attribute("data-verifier") for r in rows] == list(JUDGES)
            fit = b.execute_script(
                "const els = [...document.querySelectorAll('tr.verdict, tr.verdict td, #run-head, #timeline')];"
                "return [document.documentElement.scrollWidth, Math.max(...els.map(e => e.getBoundingClientRect()"
                ".right)), Math.max(...els.map(e => e.scrollWidth - e.clientWidth))]")
            assert fit[0] <= 390 and fit[1] <= 390 and fit[2] <= 0, fit
            reason = rows[0].find_element(By.CSS_SELECTOR, "td.reason")
            assert reason.text.startswith("the final answer names every file") and reason.is_displayed()
            screenshot_390(b, artifact(tmp_path, "ui-run-verdicts-390px.png"))
            b.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

            # a run page: absolute times and durations of the run, each step and attempt; copy buttons for ids
            passed = next(r for r in runs if r.kind == "passed")
            b.get(f"{url}/runs/{passed.run_id}")
            assert b.find_element(By.ID, "run-duration").text.startswith(duration(1500))
            assert b.find_element(By.CSS_SELECTOR, "#run-created time.ts").get_attribute("title").endswith(" UTC")
            spans = b.execute_script(
                "return [...document.querySelectorAll('.attempt')].map(a => [a.dataset.step, a.dataset.attempt,"
                " a.querySelector('.attempt-time .dur').textContent, a.querySelector('.attempt-time time').title])")
            assert [s[:3] for s in spans] == [["plan", "1", duration(1300 - 2)], ["summarize", "1", duration(300)]]
            assert all(s[3].endswith(" UTC") for s in spans), spans
            step_spans = [e.text for e in b.find_elements(By.CSS_SELECTOR, "article.step .step-time .dur")]
            assert step_spans == [duration(1298), duration(300)], step_spans
            copies = b.execute_script("return [...document.querySelectorAll('button.copy')].map(x => x.dataset.copy)")
            assert copies[0] == passed.run_id and {"plan", "summarize", "1" * 64} <= set(copies), copies
            # a finished run without verifiers is not waiting for a verdict
            assert b.find_element(By.ID, "no-verdict").text == "no verifiers: this run is not judged"
            running = next(r for r in runs if r.kind == "running")
            b.get(f"{url}/runs/{running.run_id}")
            assert b.find_element(By.ID, "run-duration").text.endswith("…")
            assert "no verdict yet" not in b.find_element(By.ID, "verdicts").text
            assert b.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href").endswith("/favicon.svg")

        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/favicon.ico") as r:
                assert r.status == 200 and r.content_type == "image/svg+xml" and b"<svg" in await r.read()
            async with http.get(url + "/?before=x") as r:
                assert r.status == 400 and "before and after are run keys" in await r.text()
            async with http.get(url + "/") as r:
                timing = r.headers["Server-Timing"]
                assert re.fullmatch(r"catchup;dur=[\d.]+, index;dur=[\d.]+, render;dur=[\d.]+, total;dur=[\d.]+",
                                    timing), timing


def screenshot_390(b: Any, path: Path) -> None:
    """A screenshot of the viewport as it is (the 390 px emulation kept, unlike support.screenshot)."""
    assert b.save_screenshot(str(path)), path
    print(f"screenshot: {path}")


_ = screenshot  # the full-page helper is for wide pages
