"""``reel ui`` over plain HTTP (no browser): bad input gets a clear error and the right status, a corrupt run is
listed as corrupt and shown as of its last good commit, a body the run does not reference is not served (nor as a
conversation), one attempt's partition is a page of its own."""

from __future__ import annotations

import html
import re
from pathlib import Path

import aiohttp

from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from tests.ui.support import env_for, reel, reel_ui


async def test_errors_and_a_corrupt_run(cfg, infra: Infra, event_log: JetStreamEventLog,  # type: ignore[no-untyped-def]
                                        tmp_path: Path) -> None:
    env = env_for(tmp_path)
    code, out, err = await reel(cfg, "run", "examples/hello.yaml", "-q", env=env)
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20}) created", out).group(1)  # type: ignore[union-attr]
    good = await event_log.load(run_id)
    prompt = next(a.prompt_ref for a in good.branches["main"].attempts["plan"] if a.prompt_ref is not None)
    async with reel_ui(cfg, env=env) as url, aiohttp.ClientSession() as http:
        async def get(path: str) -> tuple[int, str]:
            async with http.get(url + path) as r:
                return r.status, html.unescape(await r.text())  # the text as a browser shows it

        assert (await get("/runs/%3E"))[0] == 400 and "not a run id: '>'" in (await get("/runs/%3E"))[1]
        status, text = await get("/runs/r-00000000000000000000")
        assert status == 404 and f"no run 'r-00000000000000000000' in namespace {cfg.names.namespace}" in text
        status, text = await get(f"/runs/{run_id}?branch=nope")
        assert status == 404 and "has no branch 'nope' (branches: main)" in text
        assert (await get(f"/runs/{run_id}/blobs/xyz"))[0] == 400
        async with http.get(f"{url}/runs/{run_id}/blobs/{'0' * 64}?format=json") as r:
            assert r.status == 404 and (await r.json())["error"].startswith(f"run {run_id} references no blob")
        async with http.get(f"{url}/runs/{run_id}/blobs/{prompt.sha256}?format=json&offset=-5&length=10") as r:
            page = await r.json()
        assert r.status == 200 and (page["offset"], page["end"], page["total"]) == (0, 10, prompt.size_bytes)
        assert (await get(f"/runs/{run_id}/blobs/{prompt.sha256}?offset=x"))[0] == 400
        # a body that is no chat request (a tool's output) is not a conversation, and says why; one the run does
        # not name: 404
        output = next(a.output_ref for a in good.branches["main"].attempts["run"] if a.output_ref is not None)
        status, text = await get(f"/runs/{run_id}/blobs/{output.sha256}?format=chat&fragment=1")
        assert status == 422 and "not shown as a conversation: not a chat request or message" in text
        assert (await get(f"/runs/{run_id}/blobs/{'0' * 64}?format=chat"))[0] == 404
        # a model step's prompt is the chat request it sent (as an agent turn's): shown as its messages
        status, text = await get(f"/runs/{run_id}/blobs/{prompt.sha256}?format=chat&fragment=1")
        assert status == 200 and 'data-role="user"' in text, text
        assert "Write a shell command that prints a greeting." in text
        # one attempt's partition in full, a page of its own
        status, text = await get(f"/runs/{run_id}/partitions/plan/1")
        assert status == 200 and 'class="partition"' in text and 'data-budget="' in text
        assert '<h1>partition of <span class="mono">plan</span> #1' in text
        status, text = await get(f"/runs/{run_id}/partitions/plan/1?fragment=1")
        assert status == 200 and text.lstrip().startswith('<div class="partition">')
        assert (await get(f"/runs/{run_id}/partitions/plan/x"))[0] == 400
        status, text = await get(f"/runs/{run_id}/partitions/nope/1?branch=main")
        assert status == 404 and f"run {run_id} has no partition of nope #1 on branch main" in text

        # a commit that does not decode: listed as corrupt at its LSN, shown as of the last good commit
        ack = await infra.js.publish(cfg.names.events(run_id), b"{not a commit")
        status, text = await get("/?status=corrupt")
        assert status == 200 and f'data-run="{run_id}" data-status="corrupt"' in text
        assert f"at lsn {ack.seq}: undecodable" in text
        status, text = await get(f"/runs/{run_id}")
        assert status == 200 and f"run {run_id} is corrupt at LSN {ack.seq}" in text
        assert text.count('class="attempt ') == sum(len(v) for v in good.branches["main"].attempts.values())
        assert (await get(f"/runs/{run_id}/blobs/{prompt.sha256}"))[0] == 200  # its bodies still readable
