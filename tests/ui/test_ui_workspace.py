"""``reel ui`` shows each tool call's file diff under that call, in a real browser, collapsed until opened: the
agent example's ``write_file`` call fixes the typo, and its diff on the page is the one ``reel show`` prints (one
helper computes both); the calls that left the files as they were show none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.ui.support import chromium, env_for, reel, reel_ui, until

pytestmark = pytest.mark.ui

FIXED = "+    return Counter(words(text)).most_common(n)"
TYPO = "-    return Counter(words(text)).most_comon(n)"


async def test_each_tool_call_shows_its_file_diff(cfg, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", "examples/agent/fix_typo.yaml", "-q", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20})", out).group(1)  # type: ignore[union-attr]
    code, shown, err = await reel(cfg, "show", run_id, env=env)
    assert code == 0, (shown, err)
    printed = shown[shown.index("workspace changes on branch main"):].splitlines()
    assert "fix:t2:c0#1  modified wordfreq/__init__.py" in printed[1], printed
    printed_diff = [line.removeprefix("      ") for line in printed[2:] if line.startswith("      ")]
    assert TYPO in printed_diff and FIXED in printed_diff, printed
    async with reel_ui(cfg, env=env) as url:
        with chromium(tmp_path / "profile") as b:
            b.get(f"{url}/runs/{run_id}")
            await until(b, lambda d: d.find_element(By.ID, "run-id").text == run_id, "the run page")
            diffs = b.find_elements(By.CSS_SELECTOR, "details.workspace-diff")
            assert [(d.get_attribute("data-step"), d.get_attribute("data-attempt")) for d in diffs] == [
                ("fix:t2:c0", "1")]  # only the call that changed files
            call = b.find_element(By.CSS_SELECTOR, 'div.attempt[data-step="fix:t2:c0"][data-attempt="1"]')
            details = call.find_element(By.CSS_SELECTOR, "details.workspace-diff")  # under that call's attempt
            summary = details.find_element(By.TAG_NAME, "summary")
            assert summary.text == "workspace: 1 file(s) changed — modified wordfreq/__init__.py"
            pre = details.find_element(By.CSS_SELECTOR, '.file-change[data-path="wordfreq/__init__.py"] pre')
            assert details.get_attribute("open") is None and not pre.is_displayed()  # collapsed by default
            summary.click()
            await until(b, lambda d: pre.is_displayed(), "the diff opened")
            lines = pre.text.splitlines()
            assert TYPO in lines and FIXED in lines
            assert lines == printed_diff  # the same diff `reel show` prints
