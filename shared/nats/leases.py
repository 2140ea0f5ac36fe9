"""Executor leases: the holder (:class:`Lease`) and the reader (:func:`executor_alive`; as the
:class:`~reel.shared.core.ports.Liveness` port, :class:`KvLiveness`).

An executor holds an entry in the leases KV bucket (``Names.lease_bucket``; key: its
executor id; body: ``{"executor_id": …, "pid": …, "partitions": […]}`` as JSON, plus ``"tools": [...]``, the
``module:function`` paths of the function objects it serves, when it serves any: a ``reel.Worker``, and
``"waiting_for": {path: epoch ms}``, the paths runs it was handed could not resolve here lately) while it
renews it. The
bucket's max age is the lease TTL, so a dead executor's entry expires by itself; a
stopping one deletes it. Recovery and rewind read it to tell a live owner from a dead one.

On a replicated bucket (R3) a Direct Get can be answered by a follower that has not applied a
fresh renewal yet, so "no entry" is asked again of the stream leader before an executor is
declared gone: a live executor's attempt is never taken over on a lagging replica's word.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import structlog
from nats.js.errors import InvalidKeyError, KeyNotFoundError
from nats.js.kv import KeyValue

from reel.shared.core.errors import LeaseLost
from reel.shared.core.ports import Liveness
from reel.shared.nats.publish import store_full

log = structlog.get_logger(__name__)


class Lease:
    """This executor's lease: written (and acknowledged) before the executor takes any command, renewed every
    ``ttl_s / 3`` seconds, and *held* only while renewals keep landing.

    The bucket's max age is ``ttl_s``, so the server drops the entry ``ttl_s`` after the last renewal it
    stored. Each renewal is timed from the moment it was *sent* (never later than the server stored it), and
    the lease counts as held until that moment plus ``ttl_s - margin_s`` (:attr:`valid_until`, monotonic
    seconds): this executor gives its runs up strictly before any other executor can see the entry gone.
    Once that time has passed without an acknowledged renewal — the process was frozen (SIGSTOP, a VM
    pause), the server did not answer — the lease is **lost for good**: :meth:`check` raises
    :class:`~reel.shared.core.errors.LeaseLost` from then on, :attr:`lost` is set, and ``on_lost`` has run (it
    kills the tools this executor started). A lost lease is never renewed: the executor's writers cannot
    slip a write between a late renewal and their own check.

    Args:
        leases: the leases KV bucket (``Names.lease_bucket``).
        executor_id: the key; the body is ``{"executor_id", "pid", "partitions"}`` (JSON).
        ttl_s: the bucket's max age (``REEL_LEASE_TTL_S``).
        partitions: the command partitions it owns, named in the body (services/executor/partitions.py).
        tools: the ``module:function`` paths it serves function objects for, read at each renewal (a live view:
            the set may grow); named in the body as ``tools`` when not empty.
        on_lost: called once, synchronously, the moment the lease is found lost.
    """

    def __init__(self, leases: KeyValue, executor_id: str, ttl_s: float, *, partitions: Sequence[int] = (),
                 tools: Callable[[], Iterable[str]] | None = None,
                 on_lost: Callable[[], object] | None = None) -> None:
        self.kv, self.executor_id, self.ttl_s = leases, executor_id, float(ttl_s)
        self.margin_s = min(0.25, self.ttl_s / 10)
        self.valid_until = 0.0
        self._sent = 0.0
        self.lost = asyncio.Event()
        self._on_lost = on_lost
        self._partitions, self._tools = list(partitions), tools
        self.waiting: Callable[[], Mapping[str, int]] | None = None
        """The ``module:function`` paths runs wait for here (→ epoch ms of the last wait): named in the body
        as ``waiting_for`` when not empty (set by the executor once it exists)."""

    @property
    def _body(self) -> bytes:
        body: dict[str, object] = {"executor_id": self.executor_id, "pid": os.getpid(), "partitions": self._partitions}
        served = sorted(self._tools()) if self._tools is not None else []
        if served:
            body["tools"] = served
        waiting = dict(self.waiting()) if self.waiting is not None else {}
        if waiting:
            body["waiting_for"] = waiting
        return json.dumps(body).encode()

    def held(self) -> bool:
        """True while the last acknowledged renewal is recent enough (see the class doc); False once lost."""
        if self.lost.is_set() or self.valid_until == 0.0:  # lost, or not acquired yet
            return False
        if time.monotonic() >= self.valid_until:
            self._lose("not renewed in time")
            return False
        return True

    def check(self) -> None:
        """Raise unless the lease is held — call it right before every write this executor makes.

        Raises:
            LeaseLost: the lease is (now found) lost.
        """
        if not self.held():
            raise LeaseLost(f"executor {self.executor_id} lost its lease (not renewed within "
                            f"{self.ttl_s - self.margin_s:.2f}s): it writes nothing more")

    async def acquire(self, stop: asyncio.Event, *, retry_s: float = 0.5) -> bool:
        """Write the lease, retrying until the server acknowledges it; False if ``stop`` came first."""
        while not stop.is_set():
            if await self._renew():
                return True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(retry_s):
                    await stop.wait()
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Send a renewal every ``ttl_s / 3`` seconds until ``stop`` (then delete the entry) or until the lease is
        lost (then return; the entry expires by itself). A beat does not wait for the previous renewal's answer:
        on an event loop busy with many runs an answer is read late, and a renewal each beat keeps the lease as
        long as one answer is read within two beats of its sending. A renewal the server refuses is followed by
        the next beat's. Never raises."""
        beat = self.ttl_s / 3
        renewals: set[asyncio.Task[bool]] = set()
        try:
            while not stop.is_set() and self.held():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, self._sent + beat - time.monotonic())):  # a cancel goes through
                        await stop.wait()
                if stop.is_set() or not self.held():  # woken late (a freeze): lost before the renewal is sent
                    break
                renewal = asyncio.create_task(self._renew())
                renewals.add(renewal)
                renewal.add_done_callback(renewals.discard)
        finally:
            for renewal in list(renewals):
                renewal.cancel()
        if stop.is_set() and not self.lost.is_set():
            with contextlib.suppress(Exception):
                await self.kv.delete(self.executor_id)

    async def _renew(self) -> bool:
        """Write the entry; True once the server acknowledged it. The answer is awaited as long as the lease is
        held (a first write: ``ttl_s / 3``); an acknowledgement extends the lease from the moment its write was
        sent, which is never after the server stored it."""
        sent = self._sent = time.monotonic()
        wait_s = self.valid_until - sent if self.valid_until > 0.0 else self.ttl_s / 3
        try:
            async with asyncio.timeout(max(0.05, wait_s)):
                await self.kv.put(self.executor_id, self._body)
        except Exception as exc:  # a full store names itself: the lease bucket shares the server's storage
            full = store_full(exc, f"lease {self.executor_id}")
            log.warning("lease.renew_failed", executor_id=self.executor_id,
                        error=full.message if full is not None else str(exc)[:200])
            return False
        if not self.lost.is_set():
            self.valid_until = max(self.valid_until, sent + self.ttl_s - self.margin_s)
        return True

    def _lose(self, why: str) -> None:
        if self.lost.is_set():
            return
        self.lost.set()
        log.error("lease.lost", executor_id=self.executor_id, reason=why,
                  late_s=round(time.monotonic() - self.valid_until, 3))
        if self._on_lost is not None:
            self._on_lost()


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


async def tools_served(leases: KeyValue) -> dict[str, set[str]]:
    r"""``module:function`` path → the live executors whose lease says they serve it (``reel.Worker``\ s).

    Read with ``STREAM.INFO`` (the keys) and direct gets: no consumer is created. An unreadable bucket reads as
    no tool served (the caller then does what it does without a worker).
    """
    out: dict[str, set[str]] = {}
    try:  # the live keys, by the stream's subjects (STREAM.INFO: no consumer, allowed to the executor role)
        info = await leases._js.stream_info(leases._stream, subjects_filter=f"{leases._pre}>")
    except Exception:  # no answer
        return out
    for key in (subject.removeprefix(leases._pre) for subject in sorted(info.state.subjects or {})):
        try:
            entry = await leases.get(key)
            body = json.loads(entry.value or b"{}")
        except Exception:  # expired meanwhile, or not a lease body
            continue
        for path in body.get("tools", []) if isinstance(body, dict) else []:
            out.setdefault(str(path), set()).add(key)
    return out


class KvLiveness:
    """The :class:`~reel.shared.core.ports.Liveness` port over the leases bucket (:func:`executor_alive`)."""

    def __init__(self, leases: KeyValue) -> None:
        self.leases = leases

    async def alive(self, executor_id: str | None) -> bool:
        """See :func:`executor_alive`."""
        return await executor_alive(self.leases, executor_id)


def _from_leader(kv: KeyValue) -> KeyValue:
    """The same bucket read with ``$JS.API.STREAM.MSG.GET`` (answered by the stream leader only)."""
    return KeyValue(kv._name, kv._stream, kv._pre, kv._js, direct=False)


if TYPE_CHECKING:
    _port: type[Liveness] = KvLiveness  # the adapter satisfies its port (mypy checks it)
