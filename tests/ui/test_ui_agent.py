"""``reel ui`` in a real browser on the shipped agent example (examples/agent/fix_typo.yaml, the scripted model):
the runs page lists the run (with and without JavaScript, filtered by query), the run page shows every turn and
tool call with every attempt and its LSNs (the failed ``run_tests`` call too), each turn's partition, a tool
call's arguments, a prompt fetched lazily and paged by byte range, and the verdict with its snapshot LSN."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reel.shared.core.run.views import build_episode_view
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from tests.ui.support import artifact, chromium, env_for, reel, reel_ui, screenshot, until

pytestmark = pytest.mark.ui


def _dom_attempts(driver: object) -> list[tuple[str, int, str, int, int | None]]:
    from selenium.webdriver.common.by import By

    out = []
    for el in driver.find_elements(By.CSS_SELECTOR, "div.attempt"):  # type: ignore[attr-defined]
        o = el.get_attribute("data-outcome-lsn")
        out.append((el.get_attribute("data-step"), int(el.get_attribute("data-attempt")), el.get_attribute(
            "data-status"), int(el.get_attribute("data-dispatched-lsn")), int(o) if o else None))
    return out


async def test_agent_run_in_the_browser(cfg, event_log: JetStreamEventLog, blobs: JetStreamBlobStore,  # type: ignore[no-untyped-def]
                                        tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", "examples/agent/fix_typo.yaml", "-q", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20}) created", out).group(1)  # type: ignore[union-attr]
    state = await event_log.load(run_id)
    view = build_episode_view(state)
    async with reel_ui(cfg, "--page-bytes", "400", env=env) as url:
        with chromium(tmp_path / "profile-js") as b:
            b.get(url + "/")
            row = b.find_element(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]')
            cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
            assert cells[:4] == [run_id, "completed", "passed", "fix-typo"], cells
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+\d+ (s|min)", cells[4]), cells  # local time, age
            assert re.fullmatch(r"\d+(\.\d)? m?s|\d+ min \d\d s", cells[5]) and cells[6] == str(state.head_lsn), cells
            b.get(url + "/?status=running")
            assert not b.find_elements(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]')
            assert b.find_element(By.ID, "empty").is_displayed()
            b.get(url + "/?status=completed&q=FIX-TYPO")
            b.find_element(By.LINK_TEXT, run_id).click()

            await until(b, lambda d: d.find_element(By.ID, "run-id").text == run_id, "the run page")
            assert b.find_element(By.ID, "run-status").text == "completed"
            assert b.find_element(By.ID, "run-outcome").text == "passed"
            steps = [e.get_attribute("data-step") for e in b.find_elements(By.CSS_SELECTOR, "article.step")]
            assert steps == [s.step_id for s in view.steps] == [
                "fix", "fix:t1", "fix:t1:c0", "fix:t1:c1", "fix:t2", "fix:t2:c0", "fix:t3", "fix:t3:c0", "fix:t4"]
            # every attempt with its status and LSNs, as the log has them; the failed run_tests call among them
            assert _dom_attempts(b) == [(a.step_id, a.attempt, a.status, a.dispatched_lsn, a.outcome_lsn)
                                        for a in view.attempts()]
            failed = b.find_element(By.CSS_SELECTOR, 'div.attempt[data-step="fix:t1:c1"][data-status="failed"]')
            assert "exit_1: run_tests exited 1" in failed.find_element(By.CSS_SELECTOR, ".attempt-error").text
            assert "AttributeError: 'Counter' object has no attribute 'most_comon'" in failed.text  # never cut
            call = b.find_element(By.CSS_SELECTOR, 'article.step[data-step="fix:t1:c0"]')
            assert "tool read_file" in call.text and "call id call_t1_0" in call.text
            assert call.find_element(By.CSS_SELECTOR, "pre.tool-args").text == '{"path":"wordfreq/__init__.py"}'
            # each turn's partition: the ids in each group, as recorded
            for step in (s for s in view.steps if s.kind == "model"):
                a = step.attempts[-1]
                assert a.context is not None
                el = b.find_element(By.CSS_SELECTOR, f'div.attempt[data-step="{a.step_id}"]'
                                                     f'[data-attempt="{a.attempt}"]')
                collapsed = bool(el.find_elements(By.CSS_SELECTOR, ".partition .same-as"))  # test_ui_read.py
                for group in ("packed", "available", "dropped") if not collapsed else ():
                    ids = [i.get_attribute("data-item") for i in el.find_elements(
                        By.CSS_SELECTOR, f'.group[data-group="{group}"] .item')]
                    assert ids == list(getattr(a.context, group)), (a.step_id, group, ids)
                # the budget, each item's tokens and why a left-out item is where it is, as recorded
                c = a.context
                assert isinstance(c.budget_tokens, int) and isinstance(c.item_tokens, tuple)
                assert isinstance(c.packed_tokens, int) and isinstance(c.reserved_tokens, int)
                budget = el.find_element(By.CSS_SELECTOR, ".partition .budget")
                left = c.budget_tokens - c.reserved_tokens - c.packed_tokens
                assert (budget.get_attribute("data-budget"), budget.get_attribute("data-reserved"),
                        budget.get_attribute("data-packed"), budget.get_attribute("data-left")) == (
                    "1400", str(c.reserved_tokens), str(c.packed_tokens), str(left)), a.step_id
                assert f"{left} left" in budget.text and "heuristic-v1 estimate" in budget.text
                order = [(i, g) for g in ("packed", "available", "dropped") for i in getattr(c, g)]
                recorded = {i: (g, t) for (i, g), t in zip(order, c.item_tokens, strict=True)}
                chips = el.find_elements(By.CSS_SELECTOR, ".partition .item")
                shown = [(i.get_attribute("data-item"), int(i.get_attribute("data-tokens")), i.find_element(
                    By.CSS_SELECTOR, ".reason").text if i.find_elements(By.CSS_SELECTOR, ".reason") else "")
                    for i in chips]
                if not collapsed:
                    assert [t for _, t, _ in shown] == list(c.item_tokens)
                drops = dict(c.dropped_with_reasons())
                for item, t, why in shown:
                    group, tokens = recorded[item]
                    assert t == tokens, (a.step_id, item)
                    assert why == {"packed": "", "dropped": drops.get(item, ""), "available": (
                        f"needs {t} > {left} left" if t > left else f"with its group > {left} left")}[group], item
            assert "old-notes" in view.step("fix:t1").attempts[-1].context.dropped  # type: ignore[union-attr]
            assert any(s.attempts[-1].context.available for s in view.steps  # type: ignore[union-attr]
                       if s.kind == "model"), "a turn whose budget ran out"
            t = next(s for s in view.steps if s.kind == "model" and s.attempts[-1].context.available)  # type: ignore[union-attr]
            part = b.find_element(By.CSS_SELECTOR, f'div.attempt[data-step="{t.step_id}"] .partition')
            b.execute_script("arguments[0].scrollIntoView()", part)
            assert part.screenshot(str(artifact(tmp_path, "ui-partition-budget.png")))
            print(f"screenshot: {artifact(tmp_path, 'ui-partition-budget.png')}")

            # the prompt viewer: nothing fetched until opened, its raw bytes paged by 400 bytes to their end
            turn = view.step("fix:t2").attempts[-1]
            assert turn.prompt_ref is not None and turn.prompt_ref.size_bytes > 800
            body = (await blobs.get(turn.prompt_ref)).decode()
            viewer = b.find_element(By.CSS_SELECTOR, '.viewer[data-key="fix:t2#1:prompt"]')
            pre = viewer.find_element(By.CSS_SELECTOR, "pre.blob-text")
            assert b.execute_script("return arguments[0].textContent", pre) == ""
            viewer.find_element(By.TAG_NAME, "summary").click()  # a conversation (test_ui_read.py); the bytes:
            await until(b, lambda d: viewer.find_elements(By.CSS_SELECTOR, ".chat .msg"), "the conversation")
            assert b.execute_script("return arguments[0].textContent", pre) == ""
            viewer.find_element(By.CSS_SELECTOR, "details.raw-bytes summary").click()
            await until(b, lambda d: viewer.get_attribute("data-next") == "400", "the first page")
            assert b.execute_script("return arguments[0].textContent", pre) == body[:400]
            more = viewer.find_element(By.CSS_SELECTOR, "button.more")
            while more.is_displayed():
                before = viewer.get_attribute("data-next")
                more.click()
                await until(b, lambda d, before=before: viewer.get_attribute("data-next") != before, "a next page")
            assert b.execute_script("return arguments[0].textContent", pre) == body
            assert viewer.find_element(By.CSS_SELECTOR, ".progress").text == (
                f"{turn.prompt_ref.size_bytes} of {turn.prompt_ref.size_bytes} bytes")

            # the verdict with its snapshot LSN and branch, in the table and on the lineage graph
            (verdict,) = state.verdicts
            vrow = b.find_element(By.CSS_SELECTOR, 'tr.verdict[data-verifier="tests-pass"]')
            assert (vrow.get_attribute("data-status"), vrow.get_attribute("data-branch"),
                    vrow.get_attribute("data-snapshot-lsn")) == ("pass", "main", str(verdict.snapshot_lsn))
            assert verdict.snapshot_lsn == state.verifying_lsn
            lane = b.find_element(By.CSS_SELECTOR, 'svg.lineage g.lane[data-branch="main"]')
            assert b.execute_script("return arguments[0].querySelector('rect.mark title').textContent", lane) == (
                f"tests-pass: pass at lsn {verdict.snapshot_lsn}")
            await until(b, lambda d: d.find_element(By.ID, "live-state").get_attribute("data-ended") == "1",
                        "the ended run's page following nothing")
            shot = screenshot(b, artifact(tmp_path, "ui-agent-run.png"))
            assert shot.stat().st_size > 20_000

        # without JavaScript: the runs page and the run page are whole pages; the filter is a plain form
        with chromium(tmp_path / "profile-nojs", javascript=False) as b:
            b.get(url + "/")
            assert b.find_element(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]')
            assert b.find_element(By.ID, "live-runs").text == "live updates need JavaScript; reload to refresh"
            b.find_element(By.ID, "f-q").send_keys("no-such-workflow")
            b.find_element(By.ID, "f-submit").click()
            await until(b, lambda d: "q=no-such-workflow" in d.current_url, "the filtered page")
            assert not b.find_elements(By.CSS_SELECTOR, "tr[data-run]")
            assert b.find_element(By.ID, "empty").text == "no run matches the filter"
            b.get(f"{url}/runs/{run_id}")
            assert len(b.find_elements(By.CSS_SELECTOR, "div.attempt")) == len(list(view.attempts()))
            raw = b.find_element(By.CSS_SELECTOR, '.viewer[data-key="fix:t2#1:prompt"] a.raw')
            b.get(raw.get_attribute("href"))  # a closed <details> hides the link; follow it as a user would
            assert b.find_element(By.ID, "blob-text").text == body[:400].strip()
            b.find_element(By.ID, "next-page").click()
            await until(b, lambda d: "offset=400" in d.current_url, "the next page")
