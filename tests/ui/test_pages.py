"""The UI's pure parts without a browser: blob pages cut on UTF-8 boundaries, the runs filter, partitions' per-item
notes, the lineage graph of a forked golden log, and every golden log rendered through the run page's templates."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from reel.services.ui.app import _env
from reel.services.ui.pages import MAX_PAGE_BYTES, RunRow, age, blob_page, blob_refs, matches, run_row
from reel.services.ui.reader import NotARunId, check_run_id
from reel.services.ui.runview import collapse, lineage, partition, run_page
from reel.shared.core.run.events import BlobRef, ContextPartition
from reel.shared.core.run.fold import fold
from reel.shared.core.run.ids import ContextItemId
from tests.golden.regen import logs, read_log

GOLDEN = {p.stem: fold(read_log(p)) for p in logs()}


def _ref(data: bytes) -> BlobRef:
    return BlobRef(sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


def test_pages_of_a_body_join_to_it_and_never_split_a_character() -> None:
    data = ("ab€" * 50 + "😀z" * 30).encode()  # 1-, 3- and 4-byte characters
    for length in (1, 2, 3, 5, 7, 64):
        offset, texts = 0, []
        while True:
            page = blob_page(data, _ref(data), offset, length)
            assert "\ufffd" not in page.text, (length, offset)
            texts.append(page.text)
            assert page.end - page.offset <= max(length, 4)
            if page.last:
                break
            assert page.end > offset
            offset = page.end
        assert "".join(texts) == data.decode(), length
    page = blob_page(data, _ref(data), 10**9, 10)
    assert (page.offset, page.end, page.text, page.last) == (len(data), len(data), "", True)
    assert blob_page(b"x" * (MAX_PAGE_BYTES + 5), _ref(b"x"), 0, 10**9).end == MAX_PAGE_BYTES


def test_the_runs_filter_and_ages() -> None:
    row = RunRow(run_id="r-0123", status="completed", outcome="passed", workflow="fix-typo", created_ms=1_000,
                 head_lsn=9, commits=5, branches=1, active_branch="main", labels={"replayed_from": "tau.json"})
    assert matches(row) and matches(row, "completed") and not matches(row, "running")
    assert matches(row, q="FIX") and matches(row, q="r-01") and matches(row, q="tau.json")
    assert matches(row, "completed", "passed") and not matches(row, q="nothing-like-it")
    assert [age(1_000, now) for now in (43_000, 301_000, 3 * 3_600_000, 2 * 86_400_000 + 5)] == [
        "42 s", "5 min", "2 h", "1 d"]
    assert age(0, 5) == "?"


def test_the_failed_filter_and_error_search() -> None:
    row = RunRow(run_id="r-1", status="completed", outcome="failed", workflow="w", created_ms=1, head_lsn=7,
                 commits=7, branches=1, active_branch="main", failed=True,
                 errors="rate_limited: 429 Too Many Requests\ncontext_overflow: window 8192")
    ok = RunRow(run_id="r-2", status="completed", outcome="passed", workflow="w", created_ms=1, head_lsn=9,
                commits=9, branches=1, active_branch="main", errors="rate_limited: 429 Too Many Requests")
    assert matches(row, "failed") and not matches(ok, "failed") and matches(row, "completed")
    assert matches(row, q="WINDOW 8192") and not matches(ok, q="window 8192")
    assert matches(ok, q="429") and matches(row, "failed", "429") and not matches(ok, "failed", "429")
    failing = next((st for st in GOLDEN.values() if run_row(st).failed), None)
    assert failing is not None, "a golden log with a failed run"
    page = run_page(failing)
    assert page.failure is not None and page.failure.anchor


def test_run_ids_are_one_subject_token() -> None:
    assert check_run_id("r-0123abc") == "r-0123abc"
    for bad in (">", "*", "r.1", "r 1", "", "x" * 129):
        with pytest.raises(NotARunId):
            check_run_id(bad)


def test_a_partition_shows_its_budget_and_each_items_tokens_and_reason() -> None:
    ids = tuple(ContextItemId(i) for i in ("a", "b"))
    plain = partition(ContextPartition(packed=ids, available=(), dropped=(ContextItemId("c"),)))  # an old one
    assert [(g, [i.item_id for i in items]) for g, items in plain.groups] == [
        ("packed", ["a", "b"]), ("available", []), ("dropped", ["c"])]
    assert all(i.tokens is None and not i.reason for _, items in plain.groups for i in items)
    assert (plain.budget_tokens, plain.left_tokens, plain.bar()) == (None, None, ())

    rich = partition(ContextPartition(
        packed=ids, available=(ContextItemId("big"), ContextItemId("t1:msg")), dropped=(ContextItemId("c"),),
        drop_reasons=("stale",), packed_tokens=500, reserved_tokens=300, budget_tokens=1000, tokenizer="heuristic-v1",
        item_tokens=(200, 300, 450, 20, 9), trimmed=(ContextItemId("b"),)))
    items = {i.item_id: i for _, group in rich.groups for i in group}
    assert [(i.tokens, i.reason, i.trimmed) for i in items.values()] == [
        (200, "", False), (300, "", True), (450, "needs 450 > 200 left", False),
        (20, "with its group > 200 left", False), (9, "stale", False)]
    assert (rich.left_tokens, rich.group_tokens("packed"), rich.group_tokens("available")) == (200, 500, 470)
    assert rich.bar() == (("reserved", 30.0), ("packed", 50.0), ("left", 20.0))
    html = _env().get_template("_macros.html").module.partition_view(rich)  # type: ignore[attr-defined]
    assert 'data-budget="1000"' in html and "<b>200 left</b>" in html and "heuristic-v1 estimate" in html
    assert '<span class="reason">needs 450 &gt; 200 left</span>' in html
    assert '<span class="reason" title="marked stale by its producer, and the policy drops stale items' in html


def _part(packed: str, available: str = "", dropped: str = "", **kw: object) -> ContextPartition:
    ids = [tuple(ContextItemId(i) for i in g.split()) for g in (packed, available, dropped)]
    return ContextPartition(packed=ids[0], available=ids[1], dropped=ids[2], **kw)  # type: ignore[arg-type]


def test_a_partition_like_the_one_before_collapses_to_its_differences() -> None:
    base = partition(_part("sys task t1 t2", "", "old", drop_reasons=("stale",), item_tokens=(5, 5, 9, 9, 3),
                           packed_tokens=28, budget_tokens=40, reserved_tokens=0))
    nxt = partition(_part("sys task t2 t3", "t1", "old", drop_reasons=("stale",), item_tokens=(5, 5, 9, 9, 9, 3),
                          packed_tokens=28, budget_tokens=40, reserved_tokens=0))
    got = collapse(nxt, base, "attempt-a:t1-1", "turn 1")
    assert got.same_as is not None and got.groups == nxt.groups  # the items are all still there, only not shown
    assert [(c.item.item_id, c.label) for c in got.same_as.changes] == [("t3", "new in packed"),
                                                                      ("t1", "packed → available")]
    assert [(first.label, [i.item_id for i in items]) for first, items in got.same_as.sections()] == [
        ("new in packed", ["t3"]), ("packed → available", ["t1"])]
    # an item's tokens or drop reason changing counts; an available item's shortfall (the budget's) does not
    moved = partition(_part("sys task t2 t3", "t1", "old", drop_reasons=("duplicate",),
                            item_tokens=(5, 5, 9, 9, 9, 3), packed_tokens=28, budget_tokens=40, reserved_tokens=2))
    assert [(c.item.item_id, c.label) for c in collapse(moved, nxt, "x", "turn 2").same_as.changes] == [  # type: ignore[union-attr]
        ("old", "changed in dropped")]
    assert [c.label for c in collapse(base, nxt, "x", "t").same_as.changes] == [  # type: ignore[union-attr]
        "available → packed", "gone from packed"]
    # too many differences, or the same items in another order: shown in full
    assert collapse(partition(_part("a b c d")), base, "x", "t").same_as is None
    assert collapse(partition(_part("sys t1 task t2", "", "old")), partition(_part("sys task t1 t2", "", "old")),
                    "x", "t").same_as is None
    html = _env().get_template("_macros.html").module.partition_view(got)  # type: ignore[attr-defined]
    assert 'same as <a href="#attempt-a:t1-1">turn 1</a> except:' in html and html.count('class="item"') == 2


def test_a_long_agent_runs_page_grows_with_its_turns() -> None:
    """Each turn's partition (the golden agent logs') is shown against the turn before: no chip repeats an
    unchanged item, so the chips are those of the first turn plus what changed."""
    env, seen = _env(), 0
    for name, state in GOLDEN.items():
        full = run_page(state, collapse_partitions=False)
        page = run_page(state)
        parts = [e.partition for s in page.steps for e in s.attempts if e.partition is not None]
        if len(parts) < 3:
            continue
        html = env.get_template("_run_body.html").render(p=page, page_bytes=400, namespace="reel", server="")
        chips = sum(len(c.same_as.changes) if c.same_as else c.size for c in parts)
        assert html.count('class="item"') == chips, name
        assert chips < sum(p.size for s in full.steps for e in s.attempts if (p := e.partition) is not None), name
        seen += 1
    assert seen >= 2, "golden agent logs with three partitions or more"
    retried = next(s for s in run_page(GOLDEN["hand_recovery"]).steps if s.view.step_id == "think")
    shown = [(e.view.attempt, e.partition.same_as.label, e.partition.same_as.anchor)  # type: ignore[union-attr]
             for e in retried.attempts if e.partition is not None and e.partition.same_as is not None]
    assert shown[0] == (2, "think #1", "attempt-think-1"), shown  # a model step's attempts: each against the last


def test_the_lineage_of_a_forked_run() -> None:
    state = GOLDEN["hand_fork_verdicts_cancel"]
    graph = lineage(state)
    assert graph.lanes[0].branch_id == "main" and len(graph.lanes) == len(state.branches) > 1
    by = {lane.branch_id: lane for lane in graph.lanes}
    for b in state.branches.values():
        lane = by[b.branch_id]
        assert lane.parent == b.parent_branch_id and lane.fork_lsn == b.fork_lsn
        if b.parent_branch_id is not None:
            parent = by[b.parent_branch_id]
            assert lane.fy == parent.y and lane.fx is not None and lane.fx <= lane.x0 and lane.y > parent.y
        assert lane.x0 <= lane.x1 <= graph.width
    marks = [m for lane in graph.lanes for m in lane.marks]
    assert len(marks) == len(state.verdicts) > 0
    assert sum(lane.active for lane in graph.lanes) == 1 and by[state.active_branch].active


def test_the_golden_logs_hold_cancelled_and_superseded_attempts() -> None:
    attempts = [a for st in GOLDEN.values() for b in st.branches for a in run_page(st, b).view.attempts()]
    assert any(a.status == "cancelled" for a in attempts) and any(a.superseded for a in attempts)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_every_golden_log_renders_on_the_run_page(name: str) -> None:
    state = GOLDEN[name]
    env = _env()
    for bid in state.branches:
        html = env.get_template("_run_body.html").render(p=run_page(state, bid), branch_param=bid, page_bytes=100)
        page = run_page(state, bid)
        attempts = list(page.view.attempts())
        assert html.count('class="attempt ') == len(attempts)
        for status in ("succeeded", "failed", "cancelled", "dispatched"):  # every attempt, whatever became of it
            assert html.count(f'class="attempt st-{status}"') == sum(a.status == status for a in attempts)
        assert html.count('class="badge s-superseded"') == sum(a.superseded for a in attempts)
        assert html.count('<tr class="verdict"') == len(state.verdicts)
        ids = re.findall(r' id="((?:step|attempt)-[^"]+)"', html)  # an anchor per step and per attempt, unique
        assert len(ids) == len(set(ids)) == len(page.steps) + len(attempts)
        if page.failure is not None:  # the summary's link goes to an element of the page
            assert f'href="#{page.failure.anchor}"' in html and f' id="{page.failure.anchor}"' in html
        for sha in blob_refs(state):
            assert len(sha) == 64
    assert run_row(state).run_id == state.run_id


def test_the_run_page_shows_finish_reasons_usage_sources_and_error_bodies() -> None:
    state = GOLDEN["hand_model_honesty"]
    page = run_page(state)
    html = _env().get_template("_run_body.html").render(p=page, branch_param="main", page_bytes=100)
    attempts = list(page.view.attempts())
    assert html.count('class="badge finish"') == sum(isinstance(a.finish_reason, str) for a in attempts) == 3
    assert 'data-finish-reason="length"' in html and 'data-finish-reason="stop"' in html
    assert html.count('class="badge s-truncated"') == 1
    assert "source</span> estimated" in html and "source</span> none" in html
    errors = [a.error_ref for a in attempts if isinstance(a.error_ref, BlobRef)]
    assert len(errors) == 2 and all(f"/blobs/{r.sha256}" in html for r in errors)
    assert html.count('data-kind="error body"') == 2
    assert {r.sha256 for r in errors} <= set(blob_refs(state))  # the blob route serves them
    assert [k for k, _ in page.usage_by_source] == ["reported", "estimated", "none"]  # summed apart
    assert 'data-source="estimated"' in html and "input tokens</span> 204" in html


def test_markup_in_a_run_is_escaped_by_the_templates() -> None:
    import msgspec

    state = GOLDEN["hand_agent_approval"]
    evil = msgspec.structs.replace(state, workflow_name="<script>alert(1)</script>", labels=type(state.labels)(
        {"<b>k</b>": "<img src=x>"}))
    html = _env().get_template("_run_body.html").render(p=run_page(evil), branch_param="", page_bytes=100)
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img src=x>" not in html and "<b>k</b>" not in html
    row = _env().get_template("_row.html").render(r=run_row(evil))
    assert "<script>" not in row and "&lt;script&gt;" in row


def test_templates_and_script_ship_with_the_package() -> None:
    ui = Path(__file__).resolve().parents[2] / "services" / "ui"
    assert {p.name for p in (ui / "templates").iterdir()} >= {"base.html", "runs.html", "run.html", "_run_body.html"}
    assert (ui / "static" / "ui.js").read_text().count("innerHTML") == 4  # server-rendered fragments only: a row,
    # the run body, a fragment of it (/runs/<id>/delta), a conversation (/runs/<id>/blobs/<sha>?format=chat&fragment=1)


def test_the_run_header_shows_spend_against_budget_and_the_end_reason() -> None:
    state = GOLDEN["hand_budget_halt"]
    html = _env().get_template("_run_body.html").render(p=run_page(state), branch_param="main", page_bytes=100)
    assert '<dd id="run-budget">$0.0001 of $0.001, 2 of 10 tool calls</dd>' in html
    assert '<dd id="run-halt">budget_exhausted: max_cost_usd 0.001: spent 9.6e-05' in html
    plain = _env().get_template("_run_body.html").render(p=run_page(GOLDEN["hand_recovery"]), branch_param="main",
                                                         page_bytes=100)
    assert 'id="run-budget"' not in plain and 'id="run-halt"' not in plain
