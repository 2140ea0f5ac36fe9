"""The run page's live updates without a browser: a rendered body cut into fragments (services/ui/fragments.py), and
the delta from each golden log's render after commit k to its render after commit k+1 — applied to a model of the
page as ``static/ui.js`` applies it (replace by key, insert after a key, remove) it gives the new render exactly."""

from __future__ import annotations

import re

import pytest

from reel.services.ui import fragments
from reel.services.ui.app import _env
from reel.services.ui.runview import run_page
from reel.shared.core.run.fold import fold
from reel.shared.core.run.state import RunState
from tests.golden.regen import logs, read_log

LOGS = {p.stem: read_log(p) for p in logs()}
ENV = _env()

Page = dict[str, list[tuple[str, str]]]
"""A page as the browser holds it: each container's children, (key, outer HTML) in order."""


def _body(state: RunState, branch: str) -> str:
    return ENV.get_template("_run_body.html").render(p=run_page(state, branch), branch_param=branch,
                                                        page_bytes=100)


def _page(parts: list[fragments.Fragment]) -> Page:
    page: Page = {}
    for f in parts:
        page.setdefault(f.container, []).append((f.key, f.html))
    return page


def _apply(page: Page, d: fragments.Delta) -> Page:
    out = {c: list(kids) for c, kids in page.items()}
    for c, k in d.removed:
        out[c] = [kid for kid in out[c] if kid[0] != k]
    for c, k, after, html in d.changes:
        kids = out.setdefault(c, [])
        at = next((i for i, kid in enumerate(kids) if kid[0] == k), None)
        if at is not None:
            kids[at] = (k, html)
        else:
            kids.insert(0 if after is None else [kid[0] for kid in kids].index(after) + 1, (k, html))
    return out


def test_a_body_is_cut_into_its_header_sections_and_one_fragment_per_step() -> None:
    state = fold(LOGS["hand_agent_approval"])
    html = _body(state, "main")
    parts = fragments.split(html)
    top = [f.key for f in parts if f.container == ""]
    assert top[:2] == ["run-head", "lineage"] and "timeline" in top and top[-1] == "verdicts", top
    steps = [f.key for f in parts if f.container == "timeline" and f.key.startswith("step-")]
    assert steps == re.findall(r'<article id="(step-[^"]+)"', html)
    for f in parts:  # each fragment is one whole element
        if f.html:
            assert f.html.startswith("<") and f.html.endswith(">") and f.html.count("<article") == f.html.count(
                "</article>"), f.key
    assert all(f.html == "" for f in parts if f.key == "timeline")
    # nothing but whitespace and the container's own tags lies outside the fragments
    rest = html
    for f in parts:
        rest = rest.replace(f.html, "", 1) if f.html else rest
    assert re.sub(r"\s+|</?section[^>]*>", "", rest) == ""
    unnamed = [f.key for f in parts if f.key.startswith("~")]
    assert unnamed and len(set(f[:2] for f in fragments.manifest(parts))) == len(parts)


@pytest.mark.parametrize("name", sorted(LOGS))
def test_each_commit_s_delta_turns_the_old_page_into_the_new(name: str) -> None:
    commits = LOGS[name]
    sent = full = 0
    for k in range(1, len(commits)):
        old_state, new_state = fold(commits[:k]), fold(commits[:k + 1])
        for branch in new_state.branches:
            if branch not in old_state.branches:
                continue
            old, new = fragments.split(_body(old_state, branch)), fragments.split(_body(new_state, branch))
            d = fragments.delta(fragments.manifest(old), new)
            assert d is not None, (name, k, branch)
            assert _apply(_page(old), d) == _page(new), (name, k, branch)
            sent += sum(len(c[3]) for c in d.changes)
            full += sum(len(f.html) for f in new)
    assert sent < full  # unchanged steps are not sent again


def test_a_reordered_page_has_no_delta_and_a_renders_cache_forgets_the_oldest() -> None:
    a = fragments.Fragment("", "a", "<p id=a></p>", "1")
    b = fragments.Fragment("", "b", "<p id=b></p>", "2")
    assert fragments.delta(fragments.manifest([a, b]), [b, a]) is None
    assert fragments.delta(fragments.manifest([a, b]), [a]) == fragments.Delta(removed=(("", "b"),), changes=())
    renders = fragments.Renders(pages=2, per_page=2)
    for lsn in (1, 2, 3):
        renders.put(("r-1", ""), lsn, fragments.manifest([a]))
    assert renders.get(("r-1", ""), 1) is None and renders.get(("r-1", ""), 3) is not None
    renders.put(("r-2", ""), 1, ())
    renders.put(("r-3", ""), 1, ())
    assert renders.get(("r-1", ""), 3) is None and renders.get(("r-3", ""), 1) == ()


def test_void_and_self_closing_elements_and_stray_end_tags() -> None:
    html = ('<header id="h"><br><img src="x"><svg><line x1="0"/></svg></header></div>'
            '<section id="timeline"><h2>t</h2><article id="s-1"><p>x</p></article><hr></section>'
            '<section id="verdicts"></section>')
    parts = fragments.split(html)
    assert [(f.container, f.key) for f in parts] == [("", "h"), ("", "timeline"), ("timeline", "~0"),
                                                     ("timeline", "s-1"), ("timeline", "~1"), ("", "verdicts")]
    assert parts[3].html == '<article id="s-1"><p>x</p></article>' and parts[4].html == "<hr>"
