"""Executor liveness (brief §6): an executor holds an entry in the leases KV bucket while it
heartbeats; the bucket's max age is the lease TTL, so a dead executor's entry expires."""

from __future__ import annotations

import structlog
from nats.js import JetStreamContext
from nats.js.errors import InvalidKeyError, KeyNotFoundError
from nats.js.kv import KeyValue

from shared.core.commands import ResumeRun, encode
from shared.core.subjects import MSG_ID_HEADER, Names

log = structlog.get_logger(__name__)


async def executor_alive(leases: KeyValue, executor_id: str | None) -> bool:
    """True while ``executor_id`` holds a lease entry.

    ``None`` or an id that cannot be a key: False. A lease that cannot be read (the
    server did not answer): True — callers must not take over a run on a guess.
    """
    if executor_id is None:
        return False
    try:
        entry = await leases.get(executor_id)
    except (KeyNotFoundError, InvalidKeyError):
        return False
    except Exception as exc:
        log.warning("lease.unreadable", executor_id=executor_id, error=str(exc))
        return True
    return bool(entry.value)  # a server-written expiry marker has no body


async def publish_resume(js: JetStreamContext, names: Names, run_id: str, at_lsn: int) -> None:
    """Queue ``ResumeRun`` for an executor, deduplicated per (run, LSN that made it needed)."""
    await js.publish(names.command("resume"), encode(ResumeRun(run_id=run_id)),
                     headers={MSG_ID_HEADER: f"resume:{run_id}:{at_lsn}"})
