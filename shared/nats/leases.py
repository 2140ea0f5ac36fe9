"""Executor leases: the writer (:func:`heartbeat`) and the reader (:func:`executor_alive`).

An executor holds an entry in the leases KV bucket (``Names.lease_bucket``; key: its
executor id; body: ``{"executor_id": …, "pid": …, "partitions": […]}`` as JSON) while it heartbeats. The
bucket's max age is the lease TTL, so a dead executor's entry expires by itself; a
stopping one deletes it. Recovery and rewind read it to tell a live owner from a dead one.

On a replicated bucket (R3) a Direct Get can be answered by a follower that has not applied a
fresh heartbeat yet, so "no entry" is asked again of the stream leader before an executor is
declared gone: a live executor's attempt is never taken over on a lagging replica's word.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os

import structlog
from nats.js.errors import InvalidKeyError, KeyNotFoundError
from nats.js.kv import KeyValue

log = structlog.get_logger(__name__)


async def heartbeat(leases: KeyValue, executor_id: str, ttl_s: int, stop: asyncio.Event,
                    partitions: tuple[int, ...] = ()) -> None:
    """Keep ``executor_id``'s lease alive (one put every ``ttl_s / 3`` seconds) until ``stop``, then delete it.

    ``partitions``: the command partitions it owns, named in the body (``"partitions": [0, 2]``;
    services/executor/partitions.py).

    Best effort: a put or delete the server refuses is skipped (the next beat tries
    again; an undeleted lease expires after ``ttl_s``). Never raises.
    """
    body = json.dumps({"executor_id": executor_id, "pid": os.getpid(), "partitions": list(partitions)}).encode()
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await leases.put(executor_id, body)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ttl_s / 3):  # unlike 3.11's wait_for, never swallows a cancel
                await stop.wait()
    with contextlib.suppress(Exception):
        await leases.delete(executor_id)


async def executor_alive(leases: KeyValue, executor_id: str | None) -> bool:
    """True while ``executor_id`` holds a lease entry.

    ``None`` or an id that cannot be a key: False. A lease that cannot be read (the
    server did not answer): True — callers must not take over a run on a guess.
    """
    if executor_id is None:
        return False
    for kv in (leases, _from_leader(leases)):  # a follower's "absent" is checked with the leader
        try:
            entry = await kv.get(executor_id)
        except InvalidKeyError:
            return False
        except KeyNotFoundError:
            continue
        except Exception as exc:
            log.warning("lease.unreadable", executor_id=executor_id, error=str(exc))
            return True
        if entry.value:
            return True  # a server-written expiry marker has no body
    return False


def _from_leader(kv: KeyValue) -> KeyValue:
    """The same bucket read with ``$JS.API.STREAM.MSG.GET`` (answered by the stream leader only)."""
    return KeyValue(kv._name, kv._stream, kv._pre, kv._js, direct=False)
