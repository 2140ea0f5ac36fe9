"""Run control on core NATS: the cancel service's signal after its commit, and the executor's watch of it.

The executor learns of a cancel without reading the log per step: :class:`ControlHub` holds one
core-NATS subscription on ``<ns>.ctl.*`` and an :class:`Interrupt` per run it drives
(:meth:`ControlHub.watch`). A :class:`~reel.shared.core.wire.livemessages.RunControl` is a **hint**, never an order:
for a
watched run it makes the hub read the run's log from the signal's LSN (``stopped_since``), and only a
``run_cancelled`` found there, at or after that LSN, fires the interrupt (``cancelled``). A signal the log
does not bear out — forged, or aimed at the subject by anyone who may publish there — is logged
``control.unconfirmed`` and changes nothing; one check per run is in flight at a time (signals arriving
meanwhile are folded into one more check from the lowest LSN they named). :meth:`ControlHub.shutdown`
fires every watch (``shutdown``: the executor's drain deadline passed). Core NATS is at most once, so
the log stays the source of truth: the watch is registered *before* the drive loads the run (a cancel
committed earlier is in what it loads), when the connection comes back after an outage every
watched run is read from the log again (from LSN 0) — a signal published while the connection was down
is not lost — and every ``check_s`` seconds (``REEL_CANCEL_CHECK_S``, default 1) each watched run's log is
read from where the last look ended: a signal lost on the way (the cancel service died between its commit
and its signal, a dropped core-NATS message) delays a stop by at most ``check_s`` plus one read. The
executor's own commits are fenced on the run's head, so each of them also finds a cancel committed since.

That periodic look is one request for all the watched runs (``heads``: each run's last LSN), and only a run
whose log grew past what was read is read. What the drive itself holds counts as read (:meth:`ControlHub.seen`):
its state is folded from every commit up to its head and is not cancelled, and a cancel is terminal, so no
``run_cancelled`` is at or below that LSN. A run waiting on a model or a tool, with nothing committed since, costs
the look nothing but its share of the one request.

The same looks find a **takeover**: commits read from an LSN > 0 whose last ``run_started`` names another
executor mean this one lost the run while it held its lease (another writer moved the run past its fence); the
interrupt fires ``lost`` and the executor kills the run's tools and records nothing of them
(services/executor/driver.py). A look from LSN 0 (the first, or after a reconnect) reads the run's state instead:
it reports one when another executor owns the run while an attempt this one dispatched is still open (before its
own claim this executor has none, so a run it is about to take over from a dead owner is not "lost"). What a
drive holds counts as read for this too (:meth:`ControlHub.seen`): a drive that folded a takeover stops by itself.

The reconnect hook chains nats-py's ``reconnected_cb`` (the client's one callback slot; the
callback set at connect still runs first).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Literal

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from reel.shared.core.run.ids import LSN, RunId
from reel.shared.core.wire.livemessages import RunControl, decode_control, encode_live
from reel.shared.core.wire.subjects import Names

log = structlog.get_logger("reel.control")

Cause = Literal["cancelled", "shutdown", "lost"]
"""Why a drive's attempts stop: its run was cancelled, the executor's drain deadline passed, or another executor
took the run over (this one lost it: its tools are killed and nothing of them is recorded)."""


class Interrupt:
    """Why the attempts of one drive must stop now, once known: ``fired`` resolves with the first cause.

    Await ``fired`` beside the side effects (``asyncio.wait``); :attr:`cause` is ``None`` until then.
    """

    def __init__(self) -> None:
        self.fired: asyncio.Future[Cause] = asyncio.get_running_loop().create_future()

    def fire(self, cause: Cause) -> None:
        """Resolve ``fired`` with ``cause`` (a later cause is ignored)."""
        if not self.fired.done():
            self.fired.set_result(cause)

    @property
    def cause(self) -> Cause | None:
        """The cause ``fired`` resolved with (``"cancelled"`` / ``"shutdown"``), or ``None`` before it fired."""
        return self.fired.result() if self.fired.done() else None


async def publish_control(nc: Client, names: Names, run_id: str, lsn: int) -> None:
    """Tell the executor driving ``run_id`` that its cancel is committed at ``lsn`` (core NATS, best effort)."""
    body = encode_live(RunControl(run_id=RunId(run_id), signal="cancelled", lsn=LSN(lsn)))
    try:
        await nc.publish(names.control(run_id), body)
        await nc.flush(timeout=2)
    except Exception as exc:  # the log has it: the executor still stops at its next fenced commit
        log.warning("control.publish_failed", run_id=run_id, error=str(exc))


class ControlHub:
    """One executor's watch of the runs it drives.

    Args:
        nc: the executor's connection; names: its namespace.
        stopped_since: ``(run_id, from_lsn)`` → ``(cause, head_lsn)``: ``"cancelled"`` when the run's log holds its
            ``run_cancelled`` at an LSN ≥ ``from_lsn`` (``0``: anywhere), ``head_lsn`` the last LSN it read. A
            cancel is terminal (a cancelled run cannot be rewound), so one found means the run is cancelled now.
            ``"lost"`` when the run was taken over while this one drove it (see the module doc). ``None``: neither.
        check_s: how often each watched run's log is read (s); ``0``: only on signals and reconnects.
        heads: ``run_ids`` → the LSN of each one's last commit, in one request (it may lag, never lead): the
            periodic look reads only the runs whose log grew past what was read. ``None``: every watched run is
            read at each look.
    """

    def __init__(self, nc: Client, names: Names,
                 stopped_since: Callable[[str, int], Awaitable[tuple[Cause | None, int]]], *, check_s: float = 1.0,
                 heads: Callable[[Sequence[str]], Awaitable[dict[str, int]]] | None = None) -> None:
        self.nc, self.names, self.stopped_since, self.check_s = nc, names, stopped_since, check_s
        self.heads = heads
        self._watched: dict[str, list[Interrupt]] = {}
        self._read_to: dict[str, int] = {}  # run id → the LSN the periodic look has read up to
        self._poll: asyncio.Task[None] | None = None
        self._checking: dict[str, tuple[int, str] | None] = {}  # run id → (lowest LSN, why) asked for meanwhile
        self._shutdown = False
        self._sub: Subscription | None = None
        self._started: asyncio.Lock | None = None
        self._checks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Subscribe (once; later calls return at once) and hook the connection's reconnects."""
        if self._sub is not None:
            return
        if self._started is None:
            self._started = asyncio.Lock()
        async with self._started:
            if self._sub is not None:
                return
            self._sub = await self.nc.subscribe(self.names.control_all, cb=self._on_msg)
            previous = self.nc._reconnected_cb

            async def reconnected() -> None:
                if previous is not None:
                    await previous()
                self._recheck()

            self.nc._reconnected_cb = reconnected
            if self.check_s > 0:
                self._poll = asyncio.create_task(self._look_periodically())

    async def stop(self) -> None:
        """Unsubscribe (watches already fired stay fired)."""
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        for t in list(self._checks):
            t.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[Interrupt]:
        """An :class:`Interrupt` for one drive of ``run_id`` while the ``with`` block runs (:meth:`start` first)."""
        interrupt = Interrupt()
        if self._shutdown:
            interrupt.fire("shutdown")
        self._watched.setdefault(run_id, []).append(interrupt)
        try:
            yield interrupt
        finally:
            watches = self._watched.get(run_id, [])
            with contextlib.suppress(ValueError):
                watches.remove(interrupt)
            if not watches:
                self._watched.pop(run_id, None)
                self._read_to.pop(run_id, None)

    def seen(self, run_id: str, lsn: int) -> None:
        """A drive of ``run_id`` holds its state folded from every commit up to ``lsn``, and it is not cancelled:
        no ``run_cancelled`` is at or below ``lsn`` (a cancel is terminal), so the periodic look goes on from
        there. Only for a watched run (a watch that ended forgets it)."""
        if run_id in self._watched and lsn > self._read_to.get(run_id, 0):
            self._read_to[run_id] = lsn

    def shutdown(self) -> None:
        """The drain deadline passed: fire every watch (and every later one) with ``shutdown``."""
        self._shutdown = True
        for watches in self._watched.values():
            for w in watches:
                w.fire("shutdown")

    def _fire(self, run_id: str, cause: Cause) -> None:
        for w in self._watched.get(run_id, ()):
            w.fire(cause)

    async def _on_msg(self, msg: Msg) -> None:
        try:
            signal = decode_control(msg.data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("control.unreadable", subject=msg.subject, error=str(exc))
            return
        if signal.run_id in self._watched:
            log.info("control.received", run_id=signal.run_id, signal=signal.signal, lsn=signal.lsn)
            self.check(signal.run_id, int(signal.lsn), why="signal")

    def _recheck(self) -> None:
        """After a reconnect: read every watched run from the log (a signal may have been missed)."""
        for run_id in list(self._watched):
            self.check(run_id, 0, why="reconnect")

    def check(self, run_id: str, from_lsn: int, *, why: str) -> None:
        """Read ``run_id``'s log from ``from_lsn`` in the background; fire its watches if it holds the cancel.

        While a check of the run is in flight another is not started: the lowest ``from_lsn`` asked for
        meanwhile is checked once it ends (so a forged signal never hides a real one).
        """
        if run_id in self._checking:
            pending = self._checking[run_id]
            if pending is not None:
                from_lsn, why = min(pending[0], from_lsn), "signal" if "signal" in (why, pending[1]) else why
            self._checking[run_id] = (from_lsn, why)
            return
        self._checking[run_id] = None
        task = asyncio.create_task(self._check(run_id, from_lsn, why))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _look_periodically(self) -> None:
        """Every ``check_s``: a check of each watched run not yet stopped whose log grew past what was read (all
        of them without ``heads``, or when it fails), from where the last one read to."""
        while True:
            await asyncio.sleep(self.check_s)
            due = [run_id for run_id, watches in self._watched.items() if any(w.cause is None for w in watches)]
            heads: dict[str, int] | None = None
            if due and self.heads is not None:
                try:
                    heads = await self.heads(due)
                except Exception as exc:  # each run is read instead
                    log.warning("control.heads_failed", runs=len(due), error=str(exc))
            for run_id in due:
                read_to = self._read_to.get(run_id)
                if heads is not None and read_to is not None and heads.get(run_id, 0) <= read_to:
                    continue  # nothing committed since the last look (or the drive's own state)
                self.check(run_id, 0 if read_to is None else read_to + 1, why="poll")

    async def _check(self, run_id: str, from_lsn: int, why: str) -> None:
        try:
            while True:
                await self._check_once(run_id, from_lsn, why)
                again = self._checking.get(run_id)
                if again is None:
                    return
                self._checking[run_id] = None
                from_lsn, why = again
        finally:
            self._checking.pop(run_id, None)

    async def _check_once(self, run_id: str, from_lsn: int, why: str) -> None:
        """One read of ``run_id``'s log from ``from_lsn``: fire its watches if the cancel is there."""
        if run_id not in self._watched:
            return
        try:
            found, head = await self.stopped_since(run_id, from_lsn)
        except Exception as exc:  # the next look (or the next fenced commit) still finds it
            log.warning("control.recheck_failed", run_id=run_id, error=str(exc))
            return
        read_to = self._read_to.get(run_id)
        if run_id in self._watched and from_lsn <= (0 if read_to is None else read_to + 1):
            self._read_to[run_id] = max(head, read_to or 0)  # read without a gap: the next look goes on from there
        if found == "lost":
            log.warning("control.takeover_found_in_log", run_id=run_id, why=why, from_lsn=from_lsn)
            self._fire(run_id, found)
        elif found is not None:
            log.info("control.cancel_found_in_log", run_id=run_id, why=why, from_lsn=from_lsn)
            self._fire(run_id, found)
        elif why == "signal":
            log.warning("control.unconfirmed", run_id=run_id, from_lsn=from_lsn,
                        reason="no run_cancelled in the run's log at or after the signal's LSN")
