"""``reel ui --allow-actions`` in a real browser, on real runs and real services: an operator answers a question
and approves a call with edited arguments (the run goes on to completion), rejects a call and a question with
notes, cancels a running run and rewinds a finished one from a step — each recorded in the run's log with who
(``--operator``) and when, as the CLI's commands are. A post without the form's token, from another origin or for
another host is refused with the reason, a GET acts on nothing; without ``--allow-actions`` no action is rendered
and every action route answers 403 with why, changing nothing."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from reel.services.timeline.render import open_requests
from reel.shared.core.input.requestevents import InputAnswered
from reel.shared.core.run.events import BranchForked, RunCancelled
from reel.shared.core.workflow.spec import load_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.ui.support import REPO, artifact, chromium, env_for, reel_ui, screenshot, until

pytestmark = pytest.mark.ui

APPROVAL = REPO / "examples" / "agent" / "approval.yaml"
SLOW = Path(__file__).parent / "slow.yaml"
OPERATOR = "alice@ops"
EDITED = {"env": "staging", "version": "v2"}


@contextlib.asynccontextmanager
async def services(infra: Infra, cfg: Config) -> AsyncIterator[None]:
    """The services the UI's commands reach (executor, verifier, cancel — which answers respond — and rewind)."""
    from reel.services.cancel.app import serve as cancel
    from reel.services.executor.app import serve as executor
    from reel.services.rewind.app import serve as rewind
    from reel.services.verifier.app import serve as verifier

    async with running(executor, infra, cfg), running(verifier, infra, cfg), running(cancel, infra, cfg), \
            running(rewind, infra, cfg):
        yield


async def waiting_run(client: ReelClient) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A run of the approval example resting in awaiting_input: its id, its approval and its question."""
    reply = await client.start(load_workflow(APPROVAL))
    assert reply.ok and reply.run_id, reply
    state = await client.wait_for(reply.run_id, ("awaiting_input",), timeout_s=60)
    requests = {r["kind"]: r for r in open_requests(state)}
    return reply.run_id, requests["approval"], requests["question"]


def answers(events: list[Any]) -> dict[str, InputAnswered]:
    return {e.request_id: e for e in events if isinstance(e, InputAnswered)}


async def all_events(log: JetStreamEventLog, run_id: str) -> list[Any]:
    return [e for _, c in await log.read(run_id) for e in c.events]


async def test_an_operator_acts_from_the_ui(cfg, infra: Infra, client: ReelClient,  # type: ignore[no-untyped-def]
                                            event_log: JetStreamEventLog, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    async with services(infra, cfg):
        first, approval, question = await waiting_run(client)
        second, approval2, question2 = await waiting_run(client)
        async with reel_ui(cfg, "--allow-actions", "--operator", OPERATOR, "--allowed-host", "proxy.example",
                           env=env) as url:
            with chromium(tmp_path / "profile") as b:
                # the browser is driven from threads: the services run in this event loop, and a click waits for
                # the page, which waits for the command's reply
                async def post(form: Any, button: str = "button[type=submit]") -> str:
                    await asyncio.to_thread(form.find_element(By.CSS_SELECTOR, button).click)
                    return str((await until(b, lambda d: d.find_element(By.ID, "action-result"),
                                            "the action's answer")).text)

                def following(d: Any) -> bool:  # live, or ended (then it follows nothing: docs/ui.md)
                    state = d.find_element(By.ID, "live-state")
                    return bool(state.get_attribute("data-live") == "1" or state.get_attribute("data-ended") == "1")

                async def settled() -> None:  # showing the run's head: no re-render is on its way
                    run_id = b.find_element(By.ID, "run").get_attribute("data-run")
                    head = str((await event_log.load(run_id)).head_lsn)
                    await until(b, lambda d: following(d)
                                and d.find_element(By.ID, "run-head").get_attribute("data-head") == head,
                                "the run page, live at the run's head")

                async def go(where: str) -> None:
                    await asyncio.to_thread(b.get, where)
                    await settled()

                async def back() -> None:
                    await asyncio.to_thread(b.find_element(By.ID, "back-to-run").click)
                    await settled()

                def request_box(rid: str) -> Any:
                    return b.find_element(By.CSS_SELECTOR, f'.input[data-request="{rid}"]')

                await go(f"{url}/runs/{first}")
                assert b.find_element(By.ID, "actions-on").text == f"actions on, as {OPERATOR}"
                box = request_box(approval["request_id"])
                # the hints paste as they are: approve, or reject with a note; the deadline is a time
                hints = [c.text for c in box.find_elements(By.CSS_SELECTOR, "code.hint")]
                assert hints == [f"reel approve {first} {approval['request_id']} [--args JSON]",
                                 f"reel reject {first} {approval['request_id']} --note 'WHY'"], hints
                deadline = box.find_element(By.CSS_SELECTOR, "time.deadline")
                assert deadline.get_attribute("data-ms") == str(approval["deadline_ms"])
                assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", deadline.text), deadline.text
                assert "then reject" in box.text
                qbox = request_box(question["request_id"])
                qhints = [c.text for c in qbox.find_elements(By.CSS_SELECTOR, "code.hint")]
                assert qhints[0] == f"reel answer {first} {question['request_id']} 'TEXT'", qhints
                screenshot(b, artifact(tmp_path, "ui-actions-waiting.png"))

                # answer the question, then approve the call with edited arguments
                form = request_box(question["request_id"]).find_element(By.CSS_SELECTOR, "form.act-answer")
                form.find_element(By.NAME, "text").send_keys("v2")
                said = await post(form)
                assert said.startswith(f"answered request {question['request_id']} of run {first} by {OPERATOR}"), said
                await back()
                form = request_box(approval["request_id"]).find_element(By.CSS_SELECTOR, "form.act-approve")
                form.find_element(By.CSS_SELECTOR, "details.edit-args summary").click()
                area = form.find_element(By.NAME, "arguments")
                assert json.loads(area.get_attribute("value")) == json.loads(approval["arguments"])
                area.clear()
                area.send_keys(json.dumps(EDITED))
                said = await post(form)
                assert said.startswith(f"approved request {approval['request_id']} of run {first} by {OPERATOR}"), said
                await back()
                await until(b, lambda d: d.find_element(By.ID, "run-status").text == "completed", "the run went on")
                done = await event_log.load(first)
                assert (str(done.status), done.outcome) == ("completed", "passed")
                got = answers(await all_events(event_log, first))
                q, a = got[question["request_id"]], got[approval["request_id"]]
                assert (q.decision, q.text, q.by, q.source) == ("answer", "v2", OPERATOR, "respond")
                assert (a.decision, a.by) == ("approve", OPERATOR) and json.loads(a.arguments or "") == EDITED
                assert f"approved by {OPERATOR}" in request_box(approval["request_id"]).text
                assert not b.find_elements(By.CSS_SELECTOR, "form.act-approve, form.act-cancel")  # nothing open

                # reject both requests of the second run, each with a note
                await go(f"{url}/runs/{second}")
                for rid, note in ((approval2["request_id"], "not on a Friday"), (question2["request_id"], "ask QA")):
                    form = request_box(rid).find_element(By.CSS_SELECTOR, "form.act-reject")
                    form.find_element(By.NAME, "note").send_keys(note)
                    said = await post(form)
                    assert said.startswith(f"rejected request {rid} of run {second} by {OPERATOR}"), said
                    await back()
                await until(b, lambda d: d.find_element(By.ID, "run-status").text == "completed", "the run went on")
                got = answers(await all_events(event_log, second))
                assert [(got[r].decision, got[r].note, got[r].by) for r in (approval2["request_id"],
                                                                              question2["request_id"])] == [
                    ("reject", "not on a Friday", OPERATOR), ("reject", "ask QA", OPERATOR)]

                # cancel a running run
                reply = await client.start(load_workflow(SLOW))
                assert reply.run_id is not None
                slow = reply.run_id
                await client.wait_for(slow, ("running",), timeout_s=60)
                await go(f"{url}/runs/{slow}")
                form = b.find_element(By.ID, "act-cancel")
                form.find_element(By.NAME, "reason").send_keys("wrong branch")
                said = await post(form)
                assert said.startswith(f"run {slow} cancelled by {OPERATOR} at lsn"), said
                state = await client.wait_for(slow, ("cancelled",), timeout_s=30)
                (cancel,) = [e for e in await all_events(event_log, slow) if isinstance(e, RunCancelled)]
                assert (cancel.by, cancel.reason, state.cancel_reason) == (OPERATOR, "wrong branch", "wrong branch")
                assert cancel.at_ms > 0
                await back()
                assert not b.find_elements(By.CSS_SELECTOR, "#act-cancel, button.rewind")  # an ended, cancelled run
                assert b.find_element(By.ID, "run-cancelled").text == f"by {OPERATOR}: wrong branch"

                # rewind the first run from its agent step: a new branch, and the agent asks again
                await go(f"{url}/runs/{first}")
                said = await post(b.find_element(By.CSS_SELECTOR, 'article[data-step="ship"] h3'), "button.rewind")
                assert re.match(rf"run {first} rewound from step ship: branch \S+ by {OPERATOR} \(lsn \d+\); the run "
                                r"continues on it", said), said
                again = await client.wait_for(first, ("awaiting_input",), timeout_s=60)
                (fork,) = [e for e in await all_events(event_log, first) if isinstance(e, BranchForked)]
                assert (fork.by, fork.from_step, again.active_branch) == (OPERATOR, "ship", fork.branch_id)
                await go(f"{url}/runs/{first}")
                assert f"(re-running from step ship) by {OPERATOR}" in b.find_element(By.ID, "forked").text

                # a post whose token was taken out is refused, with the reason, and changes nothing
                await go(f"{url}/runs/{first}")
                head = (await event_log.load(first)).head_lsn
                form = b.find_elements(By.CSS_SELECTOR, "form.act-reject")[0]
                form.find_element(By.NAME, "note").send_keys("forged")
                b.execute_script("arguments[0].querySelector('input[name=csrf_token]').remove()", form)
                said = await post(form)
                assert b.find_element(By.ID, "action-result").get_attribute("data-code") == "csrf_token"
                assert said.startswith("refused (csrf_token): the form carries no valid token of this UI"), said
                assert (await event_log.load(first)).head_lsn == head

            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/runs/{first}") as r:
                    token = re.search(r'name="csrf_token" value="([^"]+)"', await r.text()).group(1)  # type: ignore[union-attr]
                cancel_url = f"{url}/runs/{first}/actions/cancel"
                host = url.removeprefix("http://")
                for data, headers, status, code in (
                        ({"reason": "x"}, {}, 403, "csrf_token"),
                        ({"reason": "x", "csrf_token": "0" * 43}, {}, 403, "csrf_token"),
                        ({"reason": "x", "csrf_token": token}, {"Origin": "http://evil.example"}, 403,
                         "origin_refused"),
                        ({"reason": "x", "csrf_token": token}, {"Host": "evil.example"}, 403, "host_refused")):
                    async with http.post(cancel_url, data=data, headers=headers) as r:
                        text = html.unescape(await r.text())
                        assert r.status == status and f'data-code="{code}"' in text, (data, headers, r.status, text)
                async with http.get(cancel_url) as r:
                    assert r.status == 405  # never a GET
                # the same rewind form posted twice (a reload, a double click) makes one branch
                for made in ("the run continues on it", "it already existed"):
                    async with http.post(f"{url}/runs/{first}/actions/rewind", headers={"Origin": f"http://{host}"},
                                         data={"at_step": "ship", "key": "same-form", "csrf_token": token}) as r:
                        assert r.status == 200 and made in html.unescape(await r.text())
                assert len((await event_log.load(first)).branches) == 3
                assert (await event_log.load(first)).status == "awaiting_input"
                # the token, the UI's own origin — here through a proxy named by --allowed-host: acts
                async with http.post(cancel_url, data={"reason": "done here", "csrf_token": token},
                                     headers={"Origin": "http://proxy.example", "Host": "proxy.example"}) as r:
                    assert r.status == 200, await r.text()
                assert (await event_log.load(first)).status == "cancelled"


async def test_without_allow_actions_nothing_acts(cfg, infra: Infra, client: ReelClient,  # type: ignore[no-untyped-def]
                                                  event_log: JetStreamEventLog, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    env = env_for(tmp_path)
    async with services(infra, cfg):
        run_id, approval, _question = await waiting_run(client)
        head = (await event_log.load(run_id)).head_lsn
        async with reel_ui(cfg, env=env) as url:
            with chromium(tmp_path / "profile") as b:
                await asyncio.to_thread(b.get, f"{url}/runs/{run_id}")
                assert b.find_element(By.ID, "read-only").text == "read-only"
                assert not b.find_elements(By.CSS_SELECTOR, "form, button.rewind, textarea")
                box = b.find_element(By.CSS_SELECTOR, f'.input[data-request="{approval["request_id"]}"]')
                assert f"reel reject {run_id} {approval['request_id']} --note 'WHY'" in box.text  # the hint still helps
            async with aiohttp.ClientSession() as http:
                for kind, data in (("respond", {"request_id": approval["request_id"], "decision": "approve"}),
                                   ("cancel", {"reason": "x"}), ("rewind", {"at_step": "ship"})):
                    async with http.post(f"{url}/runs/{run_id}/actions/{kind}", data=data,
                                         headers={"Origin": url}) as r:
                        text = html.unescape(await r.text())
                        assert r.status == 403 and "actions are off: this UI was started without --allow-actions" \
                            in text, (kind, r.status, text)
        assert (await event_log.load(run_id)).head_lsn == head  # nothing was sent
