"""Starting and resuming sessions: the shell around :func:`reel.services.crucible.loop.run_loop`.

* :func:`start_session` — clone the world, commit ``SessionStarted`` (fenced on
  "subject empty", so a session id is created once), baseline, loop.
* :func:`resume_session` — fold the log. A session that
  ended with a final exit is left alone and its exit returned (resuming twice is
  idempotent: no new events). Otherwise every process group a dead driver left
  (a proposer's background children) is killed (:func:`reel.shared.proc.reaper.reap_orphans`,
  ``$REEL_TOOL_DIR``), the world is reset to the log's best snapshot, the iteration in
  flight is recorded as abandoned (``SessionResumed``), the judge's fingerprint is
  checked before anything is proposed (a moved judge stops the session again at no
  cost), and the loop continues with the log's counters, spend and best sha.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import structlog
from nats.aio.client import Client

from reel.services.crucible.baseline import open_segment
from reel.services.crucible.driver import Driver, now_ms
from reel.services.crucible.gates import protected_paths
from reel.services.crucible.lab import check_lab_workflows
from reel.services.crucible.loop import run_loop
from reel.services.crucible.proposer import make_proposer
from reel.services.crucible.sessionlog import SessionLog, ensure_session_stream
from reel.services.crucible.world import GitWorld
from reel.shared.core.ports import BlobStore
from reel.shared.core.wire.subjects import is_token
from reel.shared.crucible.config import SessionConfig, parse_config
from reel.shared.crucible.errors import ConfigInvalid, SessionBusy, SessionExists
from reel.shared.crucible.events import FingerprintChanged, SegmentOpened, SessionResumed, SessionStarted
from reel.shared.crucible.fold import SessionState
from reel.shared.crucible.iteration import interrupted_row
from reel.shared.crucible.state import LoopExit
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import Infra, connect, ensure_infra
from reel.shared.proc.reaper import reap_orphans
from reel.shared.proc.subreaper import become_subreaper
from reel.shared.runtime.config import Config

log = structlog.get_logger("reel.crucible")


def load_config_file(path: Path) -> SessionConfig:
    """Read a YAML or JSON session config and resolve it (paths absolute, ``${VAR}`` expanded).

    Relative ``world.repo`` is relative to the file's directory, relative
    ``world.workdir`` to the current directory.

    Raises:
        ConfigInvalid: unreadable file, bad YAML/JSON, or an invalid config.
    """
    import yaml

    path = path.resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigInvalid(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigInvalid(f"cannot read {path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigInvalid(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigInvalid(f"{path}: the top level must be a mapping")
    return parse_config(data, config_dir=str(path.parent), cwd=os.getcwd(), environ=os.environ,
                        config_path=str(path))


def new_session_id() -> str:
    """A fresh session id (``cs-`` + 12 hex), one NATS subject token."""
    return "cs-" + uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class SessionResult:
    """How a driven session ended: its id, exit, and the driver's live (folded) state."""

    session_id: str
    exit: LoopExit
    state: SessionState


@dataclass
class Backend:
    """What a driver needs from NATS: the session log and the blob store."""

    nc: Client
    cfg: Config
    log: SessionLog
    blobs: BlobStore
    infra: Infra | None = None


@contextlib.asynccontextmanager
async def backend(cfg: Config, *, writer: str) -> AsyncIterator[Backend]:
    """Connect, create Reel's and Crucible's streams idempotently, and close on exit."""
    nc = await connect(cfg, name=f"reel-{writer}")
    try:
        infra = await ensure_infra(nc, cfg)
        await ensure_session_stream(infra.js, cfg)
        yield Backend(nc=nc, cfg=cfg, log=SessionLog(nc, cfg, writer=writer),
                      blobs=JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket, purge=not cfg.auth.configured),
                      infra=infra)
    finally:
        await nc.close()


def _driver(b: Backend, state: SessionState, world: GitWorld, stop: asyncio.Event) -> Driver:
    blobs = b.blobs if isinstance(b.blobs, JetStreamBlobStore) else None
    return Driver(state=state, log=b.log, world=world, proposer=make_proposer(state.started.config.proposer),
                  blobs=b.blobs, stop=stop, runs=ReelClient(b.nc, b.cfg, blobs))


async def start_session(b: Backend, config: SessionConfig, *, stop: asyncio.Event,
                        session_id: str | None = None) -> SessionResult:
    """Create a session and run it to its end.

    Raises:
        ConfigInvalid: ``session_id`` is not a valid token.
        SessionExists: the id already has a log.
        WorldError: the world could not be cloned.
    """
    sid = session_id or new_session_id()
    become_subreaper()  # what a proposer or judge leaves outside its group stays ours to kill
    if not is_token(sid):
        raise ConfigInvalid(f"session id {sid!r} must be letters, digits, '-' or '_' (≤ 128)")
    structlog.contextvars.bind_contextvars(session_id=sid)
    if await b.log.exists(sid):
        raise SessionExists(f"session {sid} already exists; use `reel crucible resume {sid}`")
    world, base = await GitWorld.create(config.world, sid)
    await asyncio.to_thread(check_lab_workflows, config, world.root)  # a lab that cannot measure: refused now
    with world.lock():
        started = SessionStarted(session_id=sid, config=config, base_sha=base, world_dir=str(world.root),
                                 protected=protected_paths(config, Path(config.world.repo)), at_ms=now_ms())
        try:
            lsn, _ = await b.log.append(sid, [started], expected_lsn=0)
        except SessionBusy as exc:
            raise SessionExists(f"session {sid} already exists; use `reel crucible resume {sid}`") from exc
        d = _driver(b, SessionState(started=started, lsn=lsn), world, stop)
        log.info("crucible.started", world=str(world.root), base=base[:12], protected=list(started.protected))
        ended = await open_segment(d, config.regimes[0], "baseline")
        exit_ = ended if ended is not None else await run_loop(d)
        return SessionResult(sid, exit_, d.state)


async def resume_session(b: Backend, session_id: str, *, stop: asyncio.Event) -> SessionResult:
    """Continue a session from its log (see module doc).

    Raises:
        SessionNotFound: no such session.
        SessionBusy: another process drives it.
        WorldError: its world directory is gone.
    """
    structlog.contextvars.bind_contextvars(session_id=session_id)
    become_subreaper()
    state = await b.log.load(session_id)
    if state.ended is not None and state.ended.exit.terminal:
        return SessionResult(session_id, state.ended.exit, state)
    world = GitWorld.open(state.started.world_dir, session_id)
    with world.lock():
        state = await b.log.load(session_id)  # under the lock: nobody else writes now
        if state.ended is not None and state.ended.exit.terminal:
            return SessionResult(session_id, state.ended.exit, state)
        d = _driver(b, state, world, stop)
        reaped = await asyncio.to_thread(reap_orphans)  # before the reset: nothing a dead driver started writes on
        await d.best(reattach=True)
        abandoned = interrupted_row(state.run) if state.run is not None else None
        await d.commit(SessionResumed(abandoned=abandoned, at_ms=now_ms()))
        log.info("crucible.resumed", lsn=d.state.lsn, abandoned=abandoned.it if abandoned else None,
                 best=d.run.segment.best_snap[:12] if d.state.run else None, reaped_groups=reaped)
        ended = None
        if d.state.run is None:
            ended = await open_segment(d, d.cfg.regimes[0], "baseline")
        else:
            d.fingerprint_parts = await _baseline_parts(b, session_id)
            ended = await _fingerprint_gate(d)
        exit_ = ended if ended is not None else await run_loop(d)
        return SessionResult(session_id, exit_, d.state)


async def _fingerprint_gate(d: Driver) -> LoopExit | None:
    """Stop a resumed session whose judge moved, before its proposer runs (no iteration spent)."""
    fp = await d.judge(d.regime()).fingerprint(d.world.root)  # the world is at the best snapshot, clean
    expected = d.run.segment.fingerprint
    if fp.digest == expected:
        return None
    changed = fp.changed(d.fingerprint_parts) if d.fingerprint_parts else ()
    why = (f"judge fingerprint changed ({', '.join(changed) or 'digest'}); not resuming against a moved "
           "goalpost")
    return await d.end(LoopExit.STOPPED, why, FingerprintChanged(it=d.run.next_it, expected=expected,
                                                                 actual=fp.digest, changed=changed, at_ms=now_ms()))


async def _baseline_parts(b: Backend, session_id: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for e in await b.log.events(session_id):
        if isinstance(e, SegmentOpened):
            parts = e.fingerprint_parts
    return parts
