"""``reel ui --allow-actions`` on an auth-on server (docs/security.md): with ``--auth DIR`` it connects as the
``client`` role and its action is committed, recorded with the operator; given the read-only ``viewer``'s
credentials instead, the same post is refused by the NATS permissions — a 403 page with the reason — and nothing
reaches the run."""

from __future__ import annotations

import html
import re
from pathlib import Path

import aiohttp

from reel.services.timeline.render import open_requests
from reel.shared.core.input.requestevents import InputAnswered
from reel.shared.core.workflow.spec import load_workflow
from tests.integration.authserver import auth_server, client_of, services_as_roles
from tests.ui.support import REPO, env_for, reel_ui

APPROVAL = REPO / "examples" / "agent" / "approval.yaml"


async def _post(url: str, run_id: str, data: dict[str, str]) -> tuple[int, str]:
    """Load the run page (for its form token), then post ``data`` to the respond action as the page's form would."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/runs/{run_id}") as r:
            page = await r.text()
            assert r.status == 200, page
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token is not None, "the page renders the action forms"
        async with http.post(f"{url}/runs/{run_id}/actions/respond", headers={"Origin": url},
                             data={**data, "csrf_token": token.group(1)}) as r:
            return r.status, html.unescape(await r.text())


async def test_actions_go_as_the_client_role_and_a_viewer_may_not(tmp_path: Path) -> None:
    async with auth_server(tmp_path) as server, \
            services_as_roles(server, "executor", "verifier", "cancel", "rewind"), client_of(server) as client:
        reply = await client.start(load_workflow(APPROVAL))
        assert reply.ok and reply.run_id, reply
        run_id = reply.run_id
        state = await client.wait_for(run_id, ("awaiting_input",), timeout_s=60)
        requests = {r["kind"]: r for r in open_requests(state)}
        env = env_for(tmp_path)

        viewer = {**env, **server.dir.env("viewer")}  # a dashboard's credentials: no command subject
        async with reel_ui(server.base, "--allow-actions", "--operator", "mallory", env=viewer) as url:
            status, text = await _post(url, run_id, {"request_id": requests["question"]["request_id"],
                                                     "decision": "answer", "text": "v9"})
        assert status == 403 and 'data-code="permission_denied"' in text, (status, text)
        assert "the UI's NATS user may not send this command" in text, text
        assert (await client.log.load(run_id)).head_lsn == state.head_lsn  # nothing reached the run

        with_dir = {**env, "REEL_AUTH_DIR": str(server.dir.path)}  # --auth DIR: the client role
        async with reel_ui(server.base, "--allow-actions", "--operator", "carol", env=with_dir) as url:
            status, text = await _post(url, run_id, {"request_id": requests["question"]["request_id"],
                                                     "decision": "answer", "text": "v2"})
        assert status == 200 and f"answered request {requests['question']['request_id']} of run {run_id} by carol" \
            in text, (status, text)
        answered = [e for _, c in await client.log.read(run_id) for e in c.events if isinstance(e, InputAnswered)]
        assert [(e.decision, e.text, e.by) for e in answered] == [("answer", "v2", "carol")]
