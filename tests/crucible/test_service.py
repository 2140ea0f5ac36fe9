"""The Crucible service: a run command on Reel's commands stream is acknowledged, then driven to its end."""

from __future__ import annotations

import msgspec

from reel.services.crucible.app import ResumeSession, RunSession, serve
from reel.services.crucible.session import backend
from reel.shared.core.wire.commands import Reply
from reel.shared.core.wire.subjects import REPLY_TO_HEADER
from reel.shared.crucible.names import CrucibleNames
from reel.shared.crucible.state import LoopExit
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.crucible.fixtures import make_config, make_repo, write


async def test_service_runs_a_session_from_a_command(infra: Infra, cfg: Config, root) -> None:  # type: ignore[no-untyped-def]
    names = CrucibleNames(cfg.names)
    repo = await make_repo(root, "1")
    config = make_config(root, repo, [write(2), write(1)])
    nc = infra.nc
    inbox = nc.new_inbox()
    replies = await nc.subscribe(inbox)
    log_sub = await nc.subscribe(names.session("svc-1"))
    async with running(serve, infra, cfg):
        await infra.js.publish(names.command("run"), msgspec.json.encode(RunSession(config=config, session_id="svc-1")),
                               headers={REPLY_TO_HEADER: inbox})
        reply = msgspec.json.decode((await replies.next_msg(timeout=20)).data, type=Reply)
        assert reply.ok and reply.run_id == "svc-1" and reply.status == "starting"
        async for msg in log_sub.messages:  # rendezvous: the session's last commit
            if b'"session_ended"' in msg.data:
                break
        await infra.js.publish(names.command("resume"), msgspec.json.encode(ResumeSession(session_id="nope")),
                               headers={REPLY_TO_HEADER: inbox})
        refused = msgspec.json.decode((await replies.next_msg(timeout=20)).data, type=Reply)
    assert not refused.ok and refused.error is not None and refused.error.code == "crucible_session_not_found"
    async with backend(cfg, writer="test") as b:
        state = await b.log.load("svc-1")
    assert state.ended is not None and state.ended.exit is LoopExit.FINISHED
    assert [r.verdict.value for r in state.run.rows] == ["keep", "discard"]  # type: ignore[union-attr]
