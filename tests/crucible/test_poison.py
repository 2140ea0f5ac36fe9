"""Poison isolation in the session log: a commit on a session's subject that does not
decode, names another session or is an illegal transition marks that session corrupt at its LSN — resume
refuses with one line, show prints what is known and where it breaks, ls lists it — never a traceback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reel.services.crucible.session import backend
from reel.shared.crucible.events import SessionCommit, SessionResumed, SessionStarted, encode_session_commit
from reel.shared.crucible.integrity import SessionCorrupt
from reel.shared.crucible.names import CrucibleNames
from reel.shared.crucible.state import LoopExit
from reel.shared.nats.infra import connect
from reel.shared.runtime.config import Config
from tests.crucible.conftest import Crucible
from tests.crucible.fixtures import make_config, make_repo, write
from tests.crucible.test_cli import argv, cli


def poison(kind: str, sid: str, started: SessionStarted) -> bytes:
    if kind == "undecodable":
        return b'{"v": 1, "commit_id": "x", "events": [{"type": "session_resumed"'
    if kind == "foreign":
        return encode_session_commit(SessionCommit(commit_id="p1", session_id="cs-someone-else",
                                                   events=(SessionResumed(at_ms=1),)))
    return encode_session_commit(SessionCommit(commit_id="p2", session_id=sid, events=(started,)))


REASONS = {"undecodable": "the commit does not decode", "foreign": "names another session ('cs-someone-else')",
           "illegal": "illegal transition: session"}


async def stopped_session(crucible: Crucible, root: Path, sid: str) -> SessionStarted:
    repo = await make_repo(root, "1")
    stop = asyncio.Event()
    stop.set()  # the session stops at its first gate: resumable
    o = await crucible.run(make_config(root, repo, [write(2)]), session_id=sid, stop=stop)
    assert o.exit is LoopExit.STOPPED
    first = o.events[0]
    assert isinstance(first, SessionStarted)
    return first


@pytest.mark.parametrize("kind", list(REASONS))
async def test_a_bad_commit_marks_the_session_corrupt_at_its_lsn(crucible: Crucible, cfg: Config, root: Path,
                                                                 kind: str) -> None:
    sid = f"poisoned-{kind}"
    started = await stopped_session(crucible, root, sid)
    nc = await connect(cfg)
    try:
        ack = await nc.jetstream().publish(CrucibleNames(cfg.names).session(sid), poison(kind, sid, started))
    finally:
        await nc.close()
    async with backend(cfg, writer="test") as b:
        with pytest.raises(SessionCorrupt) as caught:
            await b.log.load(sid)
        stored = len(await b.log.subjects.read_raw(sid))
    err = caught.value
    assert err.lsn == ack.seq and REASONS[kind] in err.reason
    assert err.message.startswith(f"session {sid} is corrupt at LSN {ack.seq}: ")
    assert err.state is not None and err.state.ended is not None and err.state.lsn < ack.seq  # as of the last good
    with pytest.raises(SessionCorrupt):
        await crucible.resume(sid)  # refused before anything is written
    async with backend(cfg, writer="test") as b:
        assert len(await b.log.subjects.read_raw(sid)) == stored  # nothing appended above the bad commit


async def test_the_cli_says_where_a_session_is_corrupt_in_one_line(crucible: Crucible, cfg: Config,
                                                                   root: Path) -> None:
    started = await stopped_session(crucible, root, "poisoned-cli")
    nc = await connect(cfg)
    try:
        ack = await nc.jetstream().publish(CrucibleNames(cfg.names).session("poisoned-cli"),
                                           poison("undecodable", "poisoned-cli", started))
    finally:
        await nc.close()
    line = f"error: session poisoned-cli is corrupt at LSN {ack.seq}: the commit does not decode"
    code, _, err = await cli(argv("resume", "poisoned-cli", cfg=cfg), root)
    assert code == 1 and err.startswith(line) and err.strip().count("\n") == 0, err
    code, out, err = await cli(argv("show", "poisoned-cli", cfg=cfg), root)
    assert code == 1 and err.startswith(line) and "Traceback" not in err and "crucible session poisoned-cli" in out
    code, out, _ = await cli(argv("ls", cfg=cfg), root)
    listed = next(ln for ln in out.splitlines() if ln.startswith("poisoned-cli"))
    assert code == 0 and listed.split()[:6] == ["poisoned-cli", "-", "corrupt", "at", "LSN", f"{ack.seq}:"]
