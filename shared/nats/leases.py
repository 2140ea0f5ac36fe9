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
import concurrent.futures
import contextlib
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import structlog
from nats.aio.client import Client
from nats.js.errors import InvalidKeyError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from reel.shared.core.errors import LeaseLost
from reel.shared.core.ports import Liveness
from reel.shared.nats.publish import store_full

log = structlog.get_logger(__name__)
T = TypeVar("T")

LOOP_STALL_S = 60.0
"""How long an executor's event loop may go without a tick before its lease is renewed no more (s): a loop
that slow is wedged, and its runs are better taken over."""
KEEP_RENEWALS = 64
"""How many acknowledged renewals' send times :attr:`Lease.renewals` keeps."""


class Lease:
    """This executor's lease: written (and acknowledged) before the executor takes any command, renewed every
    ``ttl_s / 3`` seconds from a thread of its own, and *held* only while renewals keep landing.

    The renewals run in a dedicated thread with its own event loop and its own NATS connection (``connect``),
    so a stall of the executor's event loop — a CPU-bound call on it, a starved CI machine — does not delay
    them: a healthy executor whose loop is late keeps its runs. Each renewal is a KV update on the revision
    the last one stored, so an entry the server dropped or another writer replaced is never silently re-made.
    The loop still shows it is alive (it ticks every ``ttl_s / 3``): a loop stalled longer than
    ``loop_stall_s`` (wedged, not slow) is renewed no more, and the lease lapses as if the process had died.

    The bucket's max age is ``ttl_s``, so the server drops the entry ``ttl_s`` after the last renewal it
    stored. Each renewal is timed from the moment it was *sent* (never later than the server stored it), and
    the lease counts as held until that moment plus ``ttl_s - margin_s`` (:attr:`valid_until`, monotonic
    seconds): this executor gives its runs up strictly before any other executor can see the entry gone.
    Once that time has passed without an acknowledged renewal — the whole process was frozen (SIGSTOP, a VM
    pause), the server did not answer, the entry was gone — the lease is **lost for good**: :meth:`check`
    raises :class:`~reel.shared.core.errors.LeaseLost` from then on, :attr:`lost` is set, and ``on_lost`` has
    run (it kills the tools this executor started; it may run on the renewal thread, at the moment the loss
    is found there). A lost lease is never renewed: the executor's writers cannot slip a write between a late
    renewal and their own check.

    Args:
        leases: the leases KV bucket (``Names.lease_bucket``), on the executor's connection.
        executor_id: the key; the body is ``{"executor_id", "pid", "partitions"}`` (JSON).
        ttl_s: the bucket's max age (``REEL_LEASE_TTL_S``).
        connect: opens the renewal thread's own connection (called on that thread's loop; closed by it).
        partitions: the command partitions it owns, named in the body (services/executor/partitions.py).
        tools: the ``module:function`` paths it serves function objects for, read at each tick of the loop (a
            live view: the set may grow); named in the body as ``tools`` when not empty.
        on_lost: called once, synchronously, the moment the lease is found lost (on either thread).
        loop_stall_s: how long the executor's loop may go without a tick before renewals stop.
    """

    def __init__(self, leases: KeyValue, executor_id: str, ttl_s: float, *,
                 connect: Callable[[], Awaitable[Client]], partitions: Sequence[int] = (),
                 tools: Callable[[], Iterable[str]] | None = None,
                 on_lost: Callable[[], object] | None = None, loop_stall_s: float = LOOP_STALL_S) -> None:
        self.kv, self.executor_id, self.ttl_s = leases, executor_id, float(ttl_s)
        self.margin_s = min(0.25, self.ttl_s / 10)
        self.loop_stall_s = loop_stall_s
        self.valid_until = 0.0
        self.lost = asyncio.Event()
        """Set (on the executor's loop) once the lease is lost; :meth:`held` knows it at once on any thread."""
        self.renewals: list[float] = []
        """Monotonic send times of the renewals acknowledged (the last :data:`KEEP_RENEWALS`)."""
        self._connect, self._on_lost = connect, on_lost
        self._partitions, self._tools = list(partitions), tools
        self.waiting: Callable[[], Mapping[str, int]] | None = None
        """The ``module:function`` paths runs wait for here (→ epoch ms of the last wait): named in the body
        as ``waiting_for`` when not empty (set by the executor once it exists)."""
        self._lost_flag = False
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # the executor's
        self._loop_seen = 0.0  # monotonic time of the loop's last tick
        self._body_now = b""
        self._renewer: _Renewer | None = None

    def _body(self) -> bytes:
        body: dict[str, object] = {"executor_id": self.executor_id, "pid": os.getpid(), "partitions": self._partitions}
        served = sorted(self._tools()) if self._tools is not None else []
        if served:
            body["tools"] = served
        waiting = dict(self.waiting()) if self.waiting is not None else {}
        if waiting:
            body["waiting_for"] = waiting
        return json.dumps(body).encode()

    def _tick(self) -> None:
        """On the executor's loop: it is alive, and this is the body the next renewal writes."""
        self._body_now = self._body()
        self._loop_seen = time.monotonic()

    def held(self) -> bool:
        """True while the last acknowledged renewal is recent enough (see the class doc); False once lost."""
        if self._lost_flag or self.valid_until == 0.0:  # lost, or not acquired yet
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
        """Start the renewal thread and wait until the server acknowledged the lease's first write; False if
        ``stop`` came first (the thread is stopped)."""
        if self._renewer is None:
            self._loop = asyncio.get_running_loop()
            self._tick()
            self._renewer = _Renewer(self, retry_s)
        renewer = self._renewer
        acquired = asyncio.ensure_future(asyncio.wrap_future(renewer.acquired))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((acquired, stopped), return_when=asyncio.FIRST_COMPLETED)
            if acquired.done() and not acquired.cancelled() and acquired.result():
                return True
        except BaseException:  # cancelled: no lease is left renewing behind us
            renewer.quit(delete=False)
            raise
        finally:
            stopped.cancel()
            acquired.cancel()
        renewer.quit(delete=False)
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Tick every ``ttl_s / 3`` seconds (the renewal thread renews) until ``stop`` (then the thread deletes
        the entry) or until the lease is lost (then return; the entry expires by itself). Cancelled, the thread
        stops renewing and the entry expires by itself. Never raises but a cancel."""
        renewer = self._renewer
        if renewer is None:
            raise RuntimeError("Lease.keep before acquire")
        ended = asyncio.ensure_future(asyncio.wrap_future(renewer.ended))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stopped.done() and not ended.done():
                self._tick()
                await asyncio.wait((ended, stopped), timeout=self.ttl_s / 3, return_when=asyncio.FIRST_COMPLETED)
            renewer.quit(delete=stop.is_set())
            await asyncio.wait((ended,), timeout=self.ttl_s)
        finally:
            renewer.quit(delete=False)  # a no-op once asked; cancelled: renew no more, let it expire
            ended.cancel()
            stopped.cancel()
        self.held()  # a lease that ran out while the thread ended is found lost now

    def _renewed(self, sent: float) -> None:
        """On the renewal thread: a renewal sent at ``sent`` was acknowledged."""
        with self._guard:
            if not self._lost_flag:
                self.valid_until = max(self.valid_until, sent + self.ttl_s - self.margin_s)
                self.renewals = [*self.renewals[-(KEEP_RENEWALS - 1):], sent]

    def _lose(self, why: str) -> None:
        with self._guard:
            if self._lost_flag:
                return
            self._lost_flag = True
        log.error("lease.lost", executor_id=self.executor_id, reason=why,
                  late_s=round(time.monotonic() - self.valid_until, 3))
        if self._on_lost is not None:
            try:
                self._on_lost()
            except Exception as exc:  # the loss is still told to the executor below
                log.error("lease.on_lost_failed", executor_id=self.executor_id, error=str(exc)[:200])
        loop = self._loop
        if loop is None:
            self.lost.set()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.lost.set()
        else:
            with contextlib.suppress(RuntimeError):  # the executor's loop is closed: nobody waits for it
                loop.call_soon_threadsafe(self.lost.set)


class _Renewer:
    """The lease's renewal thread (see :class:`Lease`): its own loop and connection; it writes the lease first
    (``acquired``: True once acknowledged, False if asked to quit before), then renews it on the revision it
    stored every ``ttl_s / 3`` seconds until asked to quit (deleting the entry if so asked) or the lease is
    lost. ``ended`` is done once the thread has closed its connection."""

    def __init__(self, lease: Lease, retry_s: float) -> None:
        self.lease, self.retry_s = lease, retry_s
        self.acquired: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self.ended: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._revision: int | None = None
        self._delete = False
        self._quit = asyncio.Event()  # used on the thread's loop only (bound to it at its first wait)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asked = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"lease-{lease.executor_id}", daemon=True)
        self._thread.start()

    def quit(self, *, delete: bool) -> None:
        """Ask the thread to stop renewing (and, with ``delete``, to delete the entry); the first ask decides."""
        if self._asked.is_set():
            return
        self._delete = delete
        self._asked.set()
        loop = self._loop  # None: the thread has not started its loop, and sees the ask when it does
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: it has ended
                loop.call_soon_threadsafe(self._quit.set)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # never lost silently: the lease then lapses by itself
            log.error("lease.renewer_failed", executor_id=self.lease.executor_id, error=str(exc)[:200])
        finally:
            _settle(self.acquired, False)
            _settle(self.ended, None)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self._quit.wait()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._asked.is_set():
            return
        lease = self.lease
        nc: Client | None = None
        while nc is None and not self._quit.is_set():
            try:
                nc = await lease._connect()
            except Exception as exc:
                log.warning("lease.connect_failed", executor_id=lease.executor_id, error=str(exc)[:200])
                await self._pause(self.retry_s)
        if nc is None:
            return
        src = lease.kv
        kv = KeyValue(src._name, src._stream, src._pre, nc.jetstream(), src._direct)
        try:
            while not self._quit.is_set() and not self.acquired.done():
                if await self._renew(kv):
                    _settle(self.acquired, True)
                else:
                    await self._pause(self.retry_s)
            await self._keep(kv)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def _keep(self, kv: KeyValue) -> None:
        lease, beat = self.lease, self.lease.ttl_s / 3
        next_at = time.monotonic() + beat
        while not self._quit.is_set() and lease.held():
            await self._pause(min(next_at, lease.valid_until) - time.monotonic())
            if self._quit.is_set() or not lease.held():  # woken late (a freeze): lost before the renewal is sent
                break
            if time.monotonic() < next_at:
                continue
            stalled = time.monotonic() - lease._loop_seen
            if stalled > lease.loop_stall_s:  # wedged, not slow: let the lease lapse
                log.error("lease.loop_stalled", executor_id=lease.executor_id, stalled_s=round(stalled, 1))
                next_at = time.monotonic() + beat  # renewed again only if the loop ticks before the lease ends
                continue
            next_at = time.monotonic() + beat
            await self._renew(kv)
        if self._quit.is_set() and self._delete and not lease._lost_flag:
            with contextlib.suppress(Exception):
                await kv.delete(lease.executor_id)

    async def _renew(self, kv: KeyValue) -> bool:
        lease = self.lease
        if self._revision is not None and not lease.held():
            return False
        sent = time.monotonic()
        try:
            async with asyncio.timeout(max(0.05, lease.ttl_s / 3)):
                if self._revision is None:
                    self._revision = await kv.put(lease.executor_id, lease._body_now)
                else:
                    self._revision = await kv.update(lease.executor_id, lease._body_now, last=self._revision)
        except KeyWrongLastSequenceError:
            await self._stored_revision(kv)
            return False
        except Exception as exc:  # a full store names itself: the lease bucket shares the server's storage
            full = store_full(exc, f"lease {lease.executor_id}")
            log.warning("lease.renew_failed", executor_id=lease.executor_id,
                        error=full.message if full is not None else str(exc)[:200])
            return False
        lease._renewed(sent)
        return True

    async def _stored_revision(self, kv: KeyValue) -> None:
        """The entry is not at the revision last stored: a renewal whose answer was lost may have landed (only
        this executor writes its key: the stored entry's revision is adopted), else the server dropped it and
        the lease is lost at once."""
        lease = self.lease
        try:
            entry = await _from_leader(kv).get(lease.executor_id)
        except KeyNotFoundError:
            lease._lose("the entry is gone on the server")
            return
        except Exception as exc:
            log.warning("lease.renew_failed", executor_id=lease.executor_id, error=str(exc)[:200])
            return
        if entry.value and entry.revision is not None:
            self._revision = entry.revision
        else:
            lease._lose("the entry is gone on the server")


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


def _settle(future: concurrent.futures.Future[T], value: T) -> None:
    """Set ``future``'s result unless it is done already (its waiter may have cancelled it)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(value)


def _from_leader(kv: KeyValue) -> KeyValue:
    """The same bucket read with ``$JS.API.STREAM.MSG.GET`` (answered by the stream leader only)."""
    return KeyValue(kv._name, kv._stream, kv._pre, kv._js, direct=False)


if TYPE_CHECKING:
    _port: type[Liveness] = KvLiveness  # the adapter satisfies its port (mypy checks it)
