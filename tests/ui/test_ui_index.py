"""The runs index over HTTP, with more than one ``reel ui``: each process builds its own from the stream, so two
processes — one started before runs arrived and following them, one started after — and a restarted one answer
every page and filter with the same runs; a page asked right after commits landed shows them; ``/heads?after=``
names only the runs that moved since the sequence its last answer covered."""

from __future__ import annotations

import re
import time
from pathlib import Path

import aiohttp

from reel.shared.nats.eventlog import JetStreamEventLog
from tests.ui.fakeruns import fill
from tests.ui.support import env_for, reel_ui

QUERIES = ("/", "/?status=failed", "/?outcome=succeeded", "/?label=team%3Dinfra", "/?q=team%3Dml", "/?q=429",
           "/?status=running&q=wf-3")


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr data-run="(r-[0-9a-f]{20})"', html)


async def _pages(http: aiohttp.ClientSession, url: str, path: str) -> list[list[str]]:
    """Every page of ``path``, following its older links."""
    out = []
    while True:
        async with http.get(url + path) as r:
            assert r.status == 200, (path, r.status)
            html = await r.text()
        out.append(_ids(html))
        older = re.search(r'<a class="older" rel="next" href="([^"]+)"', html)
        if older is None:
            return out
        path = older.group(1).replace("&amp;", "&")


async def test_ui_processes_agree_and_a_restart_rebuilds(cfg, event_log: JetStreamEventLog,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    env = env_for(tmp_path)
    t0 = int(time.time() * 1000)
    runs = await fill(event_log, 130, t0_ms=t0)
    async with reel_ui(cfg, env=env) as first, aiohttp.ClientSession() as http:
        before = await _pages(http, first, "/")
        assert [len(p) for p in before] == [100, 30] and before[0][0] == runs[-1].run_id
        runs += await fill(event_log, 90, t0_ms=t0, start=130)  # while the first one follows the stream
        now = await _pages(http, first, "/")  # asked right after: the index has caught up with them
        assert [x for p in now for x in p] == [r.run_id for r in reversed(runs)]
        # what a polling page asks: only the runs with a commit above the sequence the last answer covered
        async with http.get(first + "/heads?after=-1&limit=0") as r:
            assert await r.json() == {}
            covered = int(r.headers["X-Reel-Applied"])
        assert covered >= max(r.created_lsn for r in runs)
        two = await fill(event_log, 2, t0_ms=t0, start=220)
        async with http.get(f"{first}/heads?after={covered}") as r:
            assert set(await r.json()) == {x.run_id for x in two} and int(r.headers["X-Reel-Applied"]) > covered
        async with http.get(f"{first}/heads?after=x") as r:
            assert r.status == 400
        runs += two
        async with reel_ui(cfg, env=env) as second:
            for q in QUERIES:
                a, b = await _pages(http, first, q), await _pages(http, second, q)
                assert a == b and all(len(p) == 100 for p in a[:-1]), q
        async with reel_ui(cfg, env=env) as restarted:
            for q in QUERIES:
                assert await _pages(http, restarted, q) == await _pages(http, first, q), q
    expected = {r.run_id for r in runs if r.team == "infra"}
    async with reel_ui(cfg, env=env) as again, aiohttp.ClientSession() as http:
        got = await _pages(http, again, "/?label=team%3Dinfra")
        assert {x for p in got for x in p} == expected and len(expected) == 56
