"""The action forms without a browser: rendered only when the UI acts, each carrying the process's token; the
hints of an open request paste as they are; which hosts a post may name; edited arguments equal to the model's
are the model's."""

from __future__ import annotations

import re

import pytest

from reel.services.timeline.render import open_requests
from reel.services.ui.app import _env
from reel.services.ui.forms import LOOPBACK, _arguments, _hostname, allowed_hosts
from reel.services.ui.runview import run_page
from reel.shared.core.run.fold import fold
from tests.golden.regen import logs, read_log

GOLDEN = {p.stem: fold(read_log(p)) for p in logs()}


def _waiting():  # type: ignore[no-untyped-def]
    """The approval golden log folded up to the first commit that leaves the run awaiting input."""
    commits = read_log(next(p for p in logs() if p.stem == "hand_agent_approval"))
    folded = [fold(commits[:n]) for n in range(1, len(commits) + 1)]
    return next(s for s in folded if s is not None and str(s.status) == "awaiting_input")


WAITING = _waiting()


def _body(state, **ctx: str) -> str:  # type: ignore[no-untyped-def]
    return _env().get_template("_run_body.html").render(p=run_page(state), branch_param="", page_bytes=100, **ctx)


def test_forms_only_when_the_ui_acts_and_each_carries_the_token() -> None:
    assert str(WAITING.status) == "awaiting_input"
    request, *more = open_requests(WAITING)
    kinds = {r["kind"] for r in (request, *more)}
    read_only = _body(WAITING)
    assert "<form" not in read_only and "rewind here" not in read_only
    acting = _body(WAITING, actions_by="alice", csrf_token="tok-123")
    forms = re.findall(r"<form [^>]*>", acting)
    assert {re.search(r'class="act ([a-z-]+)"', f).group(1) for f in forms} == {  # type: ignore[union-attr]
        "act-cancel", "act-reject", "act-rewind", *(("act-approve",) if "approval" in kinds else ()),
        *(("act-answer",) if "question" in kinds else ())}
    assert acting.count('class="act act-reject"') == 1 + len(more)  # one per open request
    assert all('method="post"' in f for f in forms)
    assert acting.count('name="csrf_token" value="tok-123"') == len(forms)
    assert acting.count('form="act-rewind"') == len(run_page(WAITING).steps)  # a button per step, one form
    assert f'name="request_id" value="{request["request_id"]}"' in acting
    # the hints paste as they are: reject offered, the deadline a time
    rid, run_id = request["request_id"], WAITING.run_id
    first = "reel approve {} {} [--args JSON]" if request["kind"] == "approval" else "reel answer {} {} &#39;TEXT&#39;"
    assert f'<code class="hint">{first.format(run_id, rid)}</code>' in read_only
    assert f"<code class=\"hint\">reel reject {run_id} {rid} --note &#39;WHY&#39;</code>" in read_only


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_every_golden_log_renders_with_actions(name: str) -> None:
    state = GOLDEN[name]
    html = _body(state, actions_by="<i>ops</i>", csrf_token="t")
    assert "<i>ops</i>" not in html  # the operator's name is text
    ended = str(state.status) in ("completed", "cancelled")
    assert ('id="act-cancel"' in html) is not ended
    assert ("rewind here" in html) is (str(state.status) != "cancelled")


def test_the_hosts_a_post_may_name() -> None:
    assert allowed_hosts("127.0.0.1") == allowed_hosts("localhost") == LOOPBACK
    assert allowed_hosts("::1") == LOOPBACK and allowed_hosts("0.0.0.0") is None and allowed_hosts("::") is None
    assert allowed_hosts("10.0.0.7") == {"10.0.0.7"} and allowed_hosts("ui.example") == {"ui.example"}
    assert allowed_hosts("127.0.0.1", ["reel.example.org", "Proxy:8443"]) == LOOPBACK | {"reel.example.org", "proxy"}
    assert [_hostname(h) for h in ("127.0.0.1:8765", "[::1]:8765", "LocalHost", "evil.example:80")] == [
        "127.0.0.1", "::1", "localhost", "evil.example"]


def test_edited_arguments_equal_to_the_models_are_the_models() -> None:
    assert _arguments(' {"env": "staging"} ', '{"env":"staging"}') is None
    assert _arguments("", '{"env":"staging"}') is None
    assert _arguments('{"env": "prod"}', '{"env":"staging"}') == {"env": "prod"}
    for bad in ("[1]", "{nope"):
        refused = _arguments(bad, None)
        assert not isinstance(refused, dict) and refused is not None and refused.status_code == 400
