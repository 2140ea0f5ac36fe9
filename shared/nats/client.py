"""A small client for Reel's subjects (what ``reel`` uses; any NATS client can do the same).

It publishes a command to the commands stream with ``Reel-Reply-To`` set to a
fresh inbox, waits for JetStream's PubAck (the command is durably queued) and
then for the service's :class:`~reel.shared.core.wire.commands.Reply`. Through a failover (no server answers,
a stream leader being elected) the publish is re-sent with the same ``Nats-Msg-Id`` for up to
``REEL_FAILOVER_S`` (default 30 s) before a clear error; a missing commands stream is an error at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from reel.shared.core.errors import ReelError, RunNotFound
from reel.shared.core.run.events import Commit, Verdict
from reel.shared.core.run.forkedits import ContextEdit
from reel.shared.core.run.ids import LSN, BranchId, RunId, StepId, run_id_for_key
from reel.shared.core.run.integrity import fold_or_raise
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.commands import CancelRun, Reply, RespondRun, RewindRun, StartRun, encode
from reel.shared.core.wire.subjects import MSG_ID_HEADER, REPLY_TO_HEADER
from reel.shared.core.workflow.spec import WorkflowSpec, encode_workflow
from reel.shared.nats.access import PermissionDenied
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.publish import StoreFull, is_transient, settle_retrying, store_full
from reel.shared.runtime.config import Config

INLINE_WORKFLOW_MAX_BYTES = 256 * 1024


LOST_REPLY_CHECK_S = 5.0
"""After a reconnect, how often (s) a command waiting for its reply checks whether it took effect anyway."""

LOST_REPLY_AFTER_S = 30.0
"""With no reconnect of its own, after how long (s) a waiting command checks too: the replier's node may be
the one that went away."""

log = structlog.get_logger("reel.client")

START_TRIES = 3
"""How often :meth:`ReelClient.start` sends a start refused ``lease_lost`` (waiting 0.25 s, then 0.5 s)."""


class CommandTimeout(ReelError, TimeoutError):
    """No service answered the command in time (it stays queued; a service will pick it up)."""

    code = "command_timeout"
    retryable = True


class _NoStream(Exception):
    """The commands stream does not exist (not retried)."""


class _Full(Exception):
    """The server refused the command: its store is full (not retried: the caller is told at once)."""

    def __init__(self, full: StoreFull) -> None:
        super().__init__(full.message)
        self.full = full


class ReelClient:
    """Client-side helpers over one NATS connection."""

    def __init__(self, nc: Client, cfg: Config, blobs: JetStreamBlobStore | None = None) -> None:
        self.nc, self.cfg = nc, cfg
        self.js = nc.jetstream()
        self.log = JetStreamEventLog(nc, cfg.names)
        self.blobs = blobs
        self._keyed: bool | None = None

    async def command(self, name: str, body: bytes, *, timeout_s: float = 30.0, msg_id: str | None = None,
                      subject: str | None = None,
                      if_lost: Callable[[], Awaitable[Reply | None]] | None = None) -> Reply:
        """Publish one command and wait for its reply.

        A reply is a core NATS message: one published while this connection was reconnecting (a failover, a
        killed node) is lost although the command was handled. ``if_lost``: after a reconnect during the
        wait (or once :data:`LOST_REPLY_AFTER_S` s have passed), asked every :data:`LOST_REPLY_CHECK_S` s for
        the command's effect (e.g. the run a start made, by the id it derives); its answer is returned in
        place of the reply.

        Raises:
            CommandTimeout: the command is queued but no service answered within ``timeout_s``.
            ReelError: the commands stream does not exist (no Reel service ever ran here).
        """
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, max_msgs=1)
        headers = {REPLY_TO_HEADER: inbox, MSG_ID_HEADER: msg_id or uuid.uuid4().hex}  # a re-send is deduplicated
        try:
            reconnects = self.nc.stats["reconnects"]
            await self._publish(name, body, headers, subject)
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                try:
                    msg = await sub.next_msg(timeout=max(0.001, min(left, LOST_REPLY_CHECK_S) if if_lost else left))
                    break
                except Exception as exc:
                    if time.monotonic() >= deadline:
                        raise CommandTimeout(f"no answer to {name} within {timeout_s}s (the command stays queued)"
                                             ) from exc
                    late = time.monotonic() - (deadline - timeout_s) >= LOST_REPLY_AFTER_S
                    if if_lost is not None and (late or self.nc.stats["reconnects"] != reconnects):
                        found = await if_lost()
                        if found is not None:
                            log.info("command.reply_lost", command=name, run_id=found.run_id)
                            return found
        finally:
            await sub.unsubscribe()
        reply = msgspec.json.decode(msg.data, type=Reply)
        if reply.run_id and reply.lsn:
            self.log.note(reply.run_id, int(reply.lsn))  # reads of this run now include that commit
        return reply

    async def _publish(self, name: str, body: bytes, headers: dict[str, str], subject: str | None = None) -> None:
        """Queue one command, re-sent with the same ``Nats-Msg-Id`` while no server answers (a failover) for up to
        ``cfg.failover_s`` (``REEL_FAILOVER_S``).

        Raises:
            StoreFull: the server's JetStream storage is used up (at once: nothing was queued).
            ReelError: the commands stream does not exist (no Reel service ever ran here), or no server
                stored the command within the failover window.
        """
        stream = self.cfg.names.commands_stream
        target = subject or self.cfg.names.command(name)
        try:
            async for attempt in settle_retrying(self.cfg.failover_s):
                with attempt:
                    try:
                        await self.js.publish(target, body, headers=headers)
                    except NoStreamResponseError:
                        if await self._stream_missing(stream):
                            raise _NoStream(stream) from None
                        raise
                    except APIError as exc:
                        full = store_full(exc, target)
                        if full is not None:
                            raise _Full(full) from None
                        raise
        except _Full as exc:
            raise exc.full from None
        except _NoStream as exc:
            raise ReelError(f"no {stream} stream at {self.cfg.nats_url}: "
                            "is `reel up` (or a Reel service) running?") from exc
        except Exception as exc:
            if not is_transient(exc):
                raise
            raise ReelError(f"no server stored the {name} command within {self.cfg.failover_s:g} s "
                            f"(REEL_FAILOVER_S) at {self.cfg.nats_url}: {type(exc).__name__}") from exc

    async def _stream_missing(self, stream: str) -> bool:
        """True if JetStream answers that ``stream`` does not exist (not: no answer, as in a failover)."""
        try:
            await self.js.stream_info(stream)
        except NotFoundError:
            return True
        except Exception:  # no answer: an election or a dead node, not a missing stream
            return False
        return False

    async def start(self, spec: WorkflowSpec, *, idempotency_key: str | None = None,
                    labels: dict[str, str] | None = None, timeout_s: float = 30.0,
                    source_dir: str | None = None, sending: Callable[[RunId], None] | None = None) -> Reply:
        """Start a run of ``spec``; large workflows go by blob ref.

        ``source_dir``: the absolute folder of the workflow's file, where the executor looks for its ``python:``
        tools first (:class:`~reel.shared.core.wire.commands.StartRun`); ``None``: its working folder only.
        ``sending``: called with the run id the executor will derive just before each start command is published
        (a caller interrupted before the reply can then name the run the queued command makes).

        A start refused ``lease_lost`` (the executor that took it lost its lease meanwhile: it wrote nothing,
        the refusal is retryable) is sent again, at most :data:`START_TRIES` times in all, as a new command (a
        keyed start is answered by the run its key names either way). Lease renewals no longer wait for the
        executor's event loop, but a lease is still lost when the whole process is frozen (SIGSTOP, a VM
        pause), the server does not take its renewals (unreachable, a full store) or its loop is wedged; the
        incarnation that lost it answers the starts it had taken with that refusal and stops, and the start
        sent again reaches a live executor (the new incarnation or another).

        Raises:
            ValueError: ``source_dir`` is not an absolute, normalised path.
        """
        for attempt in range(START_TRIES):
            reply = await self._start_once(spec, idempotency_key=idempotency_key, labels=labels, timeout_s=timeout_s,
                                           source_dir=source_dir, sending=sending)
            if reply.ok or reply.error is None or reply.error.code != "lease_lost" or attempt == START_TRIES - 1:
                return reply
            log.warning("start.retried", reason=reply.error.message[:200], attempt=attempt + 1)
            await asyncio.sleep(0.25 * 2 ** attempt)
        raise AssertionError("unreachable")  # the loop returns on its last try

    async def _start_once(self, spec: WorkflowSpec, *, idempotency_key: str | None,
                          labels: dict[str, str] | None, timeout_s: float, source_dir: str | None,
                          sending: Callable[[RunId], None] | None = None) -> Reply:
        body = encode_workflow(spec)
        where: str | msgspec.UnsetType = msgspec.UNSET if source_dir is None else source_dir
        if len(body) > INLINE_WORKFLOW_MAX_BYTES and self.blobs is not None:
            ref = await self.blobs.put(body, "application/json")
            cmd = StartRun(workflow_ref=ref, idempotency_key=idempotency_key, labels=labels or {}, source_dir=where)
        else:
            cmd = StartRun(workflow=spec, idempotency_key=idempotency_key, labels=labels or {}, source_dir=where)
        msg_id = uuid.uuid4().hex
        run_id = run_id_for_key(idempotency_key or f"cmd:{msg_id}")  # the id the executor derives
        if sending is not None:
            sending(RunId(run_id))

        async def if_lost() -> Reply | None:  # the reply was lost in a reconnect: the run, if it was made
            try:
                found = await self.log.head(run_id) is not None
            except Exception:  # no answer yet (the failover goes on): keep waiting
                return None
            return Reply(ok=True, run_id=RunId(run_id), detail={"reply": "lost in a reconnect; the run exists"}) \
                if found else None

        if await self._partitioned():  # keyed by the run id the executor derives: its partition's executor
            subject = self.cfg.names.run_command(run_id, "start")
            try:
                return await self.command("start", encode(cmd), timeout_s=timeout_s, msg_id=msg_id, subject=subject,
                                          if_lost=if_lost)
            except (PermissionDenied, ReelError) as exc:  # not stored (no such subject, or not ours to publish)
                if isinstance(exc, CommandTimeout):
                    raise
                self._keyed = False
        return await self.command("start", encode(cmd), timeout_s=timeout_s, msg_id=msg_id, if_lost=if_lost)

    async def _partitioned(self) -> bool:
        """True if the commands stream partitions keyed commands (its subject transform; read once)."""
        if self._keyed is None:
            try:
                info = await self.js.stream_info(self.cfg.names.commands_stream)
                tr = info.config.subject_transform
                self._keyed = tr is not None and tr.src == self.cfg.names.run_command("*", "*")
            except Exception:  # no stream yet, or not readable: the plain subject works everywhere
                return False
        return self._keyed

    async def cancel(self, run_id: str, reason: str = "", *, by: str = "", timeout_s: float = 30.0) -> Reply:
        """Cancel a run; ``by``: who cancels (recorded on the ``run_cancelled``; ``""``: nobody named, not sent)."""
        cmd = CancelRun(run_id=RunId(run_id), reason=reason, by=by or msgspec.UNSET)
        return await self.command("cancel", encode(cmd), timeout_s=timeout_s)

    async def rewind(self, run_id: str, *, at_step: str | None = None, at_lsn: int | None = None,
                     branch: str | None = None, idempotency_key: str | None = None, by: str = "",
                     edits: Sequence[ContextEdit] = (), timeout_s: float = 30.0) -> Reply:
        """Fork a new branch of a run at a step or LSN; ``by``: who rewinds (recorded on the ``branch_forked``;
        ``""``: nobody named, not sent); ``edits``: a fork's edits of turn ``at_step`` (none: a plain rewind)."""
        cmd = RewindRun(run_id=RunId(run_id), at_step=None if at_step is None else StepId(at_step),
                        at_lsn=None if at_lsn is None else LSN(at_lsn),
                        branch=None if branch is None else BranchId(branch), idempotency_key=idempotency_key,
                        by=by or msgspec.UNSET, edits=tuple(edits) or msgspec.UNSET)
        return await self.command("rewind", encode(cmd), timeout_s=timeout_s)

    async def respond(self, run_id: str, request_id: str, decision: str, *, arguments: dict[str, Any] | None = None,
                      note: str = "", text: str = "", by: str = "", timeout_s: float = 30.0) -> Reply:
        """Answer one input request of a run (``<ns>.cmd.respond``: approve, reject or answer)."""
        cmd = msgspec.convert({"run_id": run_id, "request_id": request_id, "decision": decision,
                               "arguments": arguments, "note": note, "text": text, "by": by}, RespondRun)
        return await self.command("respond", encode(cmd), timeout_s=timeout_s)

    async def watch(self, run_id: str, *, poll_s: float = 0.05) -> AsyncIterator[RunState]:
        """Yield the run's state each time its head LSN moves: loaded once, then refreshed with only the
        commits above it (reads only this run's subject). Polls every ``poll_s`` seconds."""
        async for state, _ in self.watch_commits(run_id, poll_s=poll_s):
            yield state

    async def watch_commits(self, run_id: str, *, poll_s: float = 0.05, history: bool = False
                            ) -> AsyncIterator[tuple[RunState, list[tuple[int, Commit]]]]:
        """:meth:`watch`, with the commits each state adds: ``(state, [(lsn, commit), …])``.

        The first pair is the run as it first exists. With ``history`` it is folded
        from the run's first commit and carries every commit so far (to print the run
        from the start); otherwise it is the snapshot-aware :meth:`EventLog.load` and
        carries none. Each later pair carries the commits above the previous one, in
        LSN order. Waits (polling every ``poll_s`` s) for a run that has no commit yet.
        The yielded state is the same object, refreshed in place.

        Raises:
            RunCorrupt: the run is, or becomes, corrupt (:mod:`reel.shared.core.run.integrity`).
        """
        state: RunState | None = None
        first: list[tuple[int, Commit]] = []
        while state is None:
            if history:
                first = await self.log.read(run_id)
                state = fold_or_raise(first)
            else:
                with contextlib.suppress(RunNotFound):
                    state = await self.log.load(run_id)
            if state is None:
                await asyncio.sleep(poll_s)
        yield state, first
        while True:
            state, new = await self.log.refresh(state)
            if new:
                yield state, new
            else:
                await asyncio.sleep(poll_s)

    async def wait_for(self, run_id: str, statuses: tuple[str, ...] = ("verifying", "completed", "cancelled"),
                       *, timeout_s: float = 120.0) -> RunState:
        """Wait until the run's status is one of ``statuses``.

        Raises:
            TimeoutError: not reached within ``timeout_s``.
        """
        async def go() -> RunState:
            async for state in self.watch(run_id):
                if state.status in statuses:
                    return state
            raise AssertionError("unreachable")

        return await asyncio.wait_for(go(), timeout_s)

    async def verdicts(self, run_id: str) -> list[Verdict]:
        """Verdicts recorded in the run's log so far."""
        return list((await self.log.load(run_id)).verdicts)
