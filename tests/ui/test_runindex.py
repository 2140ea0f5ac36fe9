"""The runs page's index without a browser or a server: every query answers what a scan of every row would, pages
cover the matches once each, newest first, and stay the same pages when newer runs arrive; rows are replaced."""

from __future__ import annotations

import random

from reel.services.ui.pages import RunRow, matches
from reel.services.ui.runindex import RunFilter, RunIndex, trigrams

STATUSES = ("running", "completed", "cancelled", "awaiting_input")
OUTCOMES = ("", "passed", "failed", "succeeded")
ERRORS = ("", "rate_limited: 429 Too Many Requests", "context_overflow: the window 8192")


def _row(i: int, rng: random.Random) -> RunRow:
    status = rng.choice(STATUSES)
    outcome = rng.choice(OUTCOMES) if status == "completed" else ""
    return RunRow(run_id=f"r-{i:020x}", status=status, outcome=outcome, workflow=f"wf-{i % 5}", created_ms=i,
                  head_lsn=3 * i + 2, commits=2, branches=1, active_branch="main",
                  labels={"team": ("infra", "ml", "web")[i % 3], "n": str(i)}, failed=outcome == "failed",
                  errors=rng.choice(ERRORS), created_lsn=3 * i + 1)


def _pages(index: RunIndex, f: RunFilter, size: int) -> list[list[str]]:
    pages, page = [], index.query(f, limit=size)
    while True:
        pages.append([r.run_id for r in page.rows])
        if page.older is None:
            return pages
        page = index.query(f, before=page.older, limit=size)


FILTERS = [RunFilter(), RunFilter(status="completed"), RunFilter(status="failed"), RunFilter(outcome="passed"),
           RunFilter(label="team=infra"), RunFilter(label="team"), RunFilter(q="team=infra"), RunFilter(q="TEAM=ML"),
           RunFilter(q="429"), RunFilter(q="window 8192"), RunFilter(q="wf"), RunFilter(q="r-0000000000000000001"),
           RunFilter(status="completed", q="429", label="team=web"), RunFilter(q="no such text"),
           RunFilter(q="m=i")]  # a trigram spanning "team" and "infra" only through "=": as shown


def test_queries_answer_as_a_scan_would_and_pages_cover_each_match_once() -> None:
    rng = random.Random(7)
    rows = [_row(i, rng) for i in range(1, 538)]
    index = RunIndex()
    for r in rng.sample(rows, len(rows)):  # any order in
        index.put(r)
    newest_first = sorted(rows, key=lambda r: -r.created_lsn)
    for f in FILTERS:
        want = [r.run_id for r in newest_first if matches(r, f.status, f.q, outcome=f.outcome, label=f.label)]
        pages = _pages(index, f, 100)
        assert [x for p in pages for x in p] == want, f
        assert all(len(p) == 100 for p in pages[:-1]), f
        assert index.query(f).total == len(want), f
    assert matches(rows[0], q="team=infra") is (rows[0].labels["team"] == "infra")


def test_pages_are_stable_when_newer_runs_arrive_and_rows_change() -> None:
    rng = random.Random(3)
    index = RunIndex()
    for i in range(1, 251):
        index.put(_row(i, rng))
    first = index.query(RunFilter())
    second = index.query(RunFilter(), before=first.older)
    third = index.query(RunFilter(), before=second.older)
    assert [len(p.rows) for p in (first, second, third)] == [100, 100, 50]
    assert (second.first, third.first, third.older, first.newer) == (101, 201, None, None)
    for i in range(251, 281):  # 30 newer runs
        index.put(_row(i, rng))
    again = index.query(RunFilter(), before=first.older)
    assert again.rows == second.rows and again.first == 131  # the same runs, 30 more above them
    back = index.query(RunFilter(), after=third.rows[0].created_lsn)
    assert back.rows == second.rows  # newer from page 3: page 2 again
    up = index.query(RunFilter(), after=back.rows[0].created_lsn)
    assert up.rows == first.rows and up.newer is not None  # the 100 just above it: page 1 as it was
    top = index.query(RunFilter(), after=up.rows[0].created_lsn)  # 30 above those: the first page as it is now
    assert [r.run_id for r in top.rows] == [f"r-{i:020x}" for i in range(280, 180, -1)] and top.newer is None

    # a row replaced: its postings move with it
    old = index.get("r-" + f"{5:020x}")
    assert old is not None
    moved = RunRow(**{**old.__dict__, "status": "completed", "outcome": "failed", "failed": True,
                      "errors": "boom: quite unlike the others"})
    index.put(moved)
    assert len(index) == 280 and index.get(moved.run_id) == moved
    assert [r.run_id for r in index.query(RunFilter(q="quite unlike")).rows] == [moved.run_id]
    assert moved.run_id in {r.run_id for r in index.query(RunFilter(status="failed"), limit=1000).rows}
    if old.status != "completed":
        assert moved.run_id not in {r.run_id for r in index.query(RunFilter(status=old.status), limit=1000).rows}
    index.drop(moved.run_id)
    assert index.get(moved.run_id) is None and not index.query(RunFilter(q="quite unlike")).rows
    assert trigrams("ab") == set() and trigrams("abcd") == {"abc", "bcd"} and trigrams("ab\ncd") == set()
