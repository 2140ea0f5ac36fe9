"""Helpers of the browser tests: headless Chromium driven by Selenium, and ``reel`` (incl. ``reel ui``) as a process.

Chromium and its driver are Debian's (``/usr/bin/chromium``, ``/usr/bin/chromedriver``;
``.ci/run`` installs them). Without them the tests skip with the reason, or fail under CI.
Chromium runs with the flags that keep it off the network (no background networking,
component updates, sync or QUIC) and a fresh profile per browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reel.shared.runtime.config import Config

REPO = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1300,1800")
WAIT_S = 60.0


def require_chromium() -> None:
    """Skip (fail under ``CI``) unless Debian's chromium and chromium-driver are installed."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        msg = (f"headless Chromium not installed ({', '.join(missing)} missing): "
               "apt-get install -y chromium chromium-driver (.ci/run does)")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@contextlib.contextmanager
def chromium(profile: Path, *, javascript: bool = True) -> Iterator[Any]:
    """A headless Chromium (Selenium WebDriver) with a fresh profile in ``profile``; JavaScript off if asked."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    require_chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    if not javascript:
        opts.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


async def until(driver: Any, condition: Callable[[Any], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Wait (in a thread, so this event loop keeps serving) until ``condition(driver)`` is truthy; returns it. An
    element missing or gone stale meanwhile (a live page re-rendered it between lookup and read) is tried again."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout_s, poll_frequency=0.1,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
    return await asyncio.to_thread(wait.until, condition, what)


def artifact(tmp_path: Path, name: str) -> Path:
    """Where a screenshot goes: ``$REEL_ARTIFACTS/<name>`` if set, else under the test's tmp dir."""
    base = Path(os.environ.get("REEL_ARTIFACTS") or tmp_path)
    base.mkdir(parents=True, exist_ok=True)
    return base / name


def screenshot(driver: Any, path: Path) -> Path:
    """Save a full-page PNG of the current page (the window grown to the page's height, ≤ 8000 px)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1300, min(max(height + 40, 800), 8000))
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")
    return path


def env_for(tmp_path: Path) -> dict[str, str]:
    """The user's environment, with scratch copies (the agent example's) under ``tmp_path``."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "REEL_HOME": str(tmp_path / "home"), "COLUMNS": "200"}


async def reel(cfg: Config, *args: str, env: dict[str, str], timeout_s: float = 180) -> tuple[int, str, str]:
    """``reel ARGS --nats-url … --namespace …`` as a process from the repository root: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", *args,
        "--nats-url", cfg.nats_url, "--namespace", cfg.names.namespace,
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def reel_ui(cfg: Config, *args: str, env: dict[str, str]) -> AsyncIterator[str]:
    """``reel ui --port 0 ARGS`` as a process for the block; yields the URL it prints once it listens."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reel.services.cli", "ui", "--port", "0", *args, "--nats-url", cfg.nats_url,
        "--namespace", cfg.names.namespace, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 90)).decode()
        found = re.search(r"reel ui: (http://\S+)", line)
        if found is None:
            rest = (await asyncio.wait_for(proc.stderr.read(), 10)).decode() if proc.returncode is not None else ""
            raise AssertionError(f"reel ui printed {line!r} {rest}")
        assert ("actions allowed, as " if "--allow-actions" in args else "read-only") in line, line
        yield found.group(1)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
