"""A start's reply lost in a reconnect (the client rides out a failover). A reply is a core
NATS message: one published while the client's connection is reconnecting (its node was killed) is gone,
although the command was handled. Seen in CI: one of 200 starts through an events-leader kill got no reply
within 120 s while its run completed. The client, after a reconnect during the wait, looks for the run the
start derives its id from and answers with it (``command.reply_lost``).

Here no executor runs: the test stores the start, commits the run the executor would have made, and kills and
restarts the server (same port and store) so the waiting client reconnects. Before the fix: CommandTimeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from reel.shared.application.fenced import commit_new
from reel.shared.core.run.events import BlobRef, RunCreated
from reel.shared.core.run.ids import ROOT_BRANCH, RunId, run_id_for_key
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import connect, ensure_infra
from reel.shared.runtime.config import Config
from tests.faults.procs import killable_server
from tests.integration.scenarios import wait_until

pytestmark = pytest.mark.faults


async def test_a_start_whose_reply_is_lost_in_a_reconnect_answers_with_its_run(cfg: Config, tmp_path: Path) -> None:
    async with killable_server(tmp_path / "server") as srv:
        cfg = dataclasses.replace(cfg, nats_url=srv.url, storage="file")
        nc = await connect(cfg, name="faults-lost-reply")
        try:
            infra = await ensure_infra(nc, cfg)
            client = ReelClient(nc, cfg)
            spec = parse_workflow({"name": "lost-reply", "steps": [
                {"kind": "tool", "id": "s1", "tool": {"type": "recorded", "output": "ok"}}]})
            waiting = asyncio.ensure_future(client.start(spec, idempotency_key="lost-reply", timeout_s=60))

            async def stored() -> bool:
                return (await infra.js.stream_info(cfg.names.commands_stream)).state.messages >= 1
            await wait_until(stored, timeout_s=20, what="the start command stored")

            run_id = run_id_for_key("lost-reply")  # what an executor would have made, its reply then lost
            created = RunCreated(run_id=RunId(run_id), branch_id=ROOT_BRANCH, workflow_name="lost-reply", steps=(),
                                 workflow_ref=BlobRef(sha256="0" * 64, size_bytes=0, media_type="application/json"),
                                 created_ms=0)
            assert (await commit_new(JetStreamEventLog(nc, cfg.names), run_id, [created],
                               writer="x-test")).commit is not None
            await srv.kill()
            await srv.start()

            reply = await asyncio.wait_for(waiting, 60)
            assert (reply.ok, reply.run_id) == (True, run_id), reply
            assert "lost in a reconnect" in reply.detail.get("reply", ""), reply
            assert nc.stats["reconnects"] >= 1
        finally:
            await nc.close()
