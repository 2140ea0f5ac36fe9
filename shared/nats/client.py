"""A small client for Reel's subjects (what ``reel`` uses; any NATS client can do the same).

It publishes a command to the commands stream with ``Reel-Reply-To`` set to a
fresh inbox, waits for JetStream's PubAck (the command is durably queued) and
then for the service's :class:`~shared.core.commands.Reply`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.errors import NoStreamResponseError

from shared.config import Config
from shared.core.commands import CancelRun, Reply, RespondRun, RewindRun, StartRun, encode
from shared.core.errors import ReelError, RunNotFound
from shared.core.events import Commit, Verdict
from shared.core.fold import RunState
from shared.core.ids import LSN, BranchId, RunId, StepId
from shared.core.integrity import fold_or_raise
from shared.core.subjects import MSG_ID_HEADER, REPLY_TO_HEADER
from shared.core.workflow import WorkflowSpec, encode_workflow
from shared.nats.blobstore import JetStreamBlobStore
from shared.nats.eventlog import JetStreamEventLog

INLINE_WORKFLOW_MAX_BYTES = 256 * 1024


class CommandTimeout(ReelError, TimeoutError):
    """No service answered the command in time (it stays queued; a service will pick it up)."""

    code = "command_timeout"
    retryable = True


class ReelClient:
    """Client-side helpers over one NATS connection."""

    def __init__(self, nc: Client, cfg: Config, blobs: JetStreamBlobStore | None = None) -> None:
        self.nc, self.cfg = nc, cfg
        self.js = nc.jetstream()
        self.log = JetStreamEventLog(nc, cfg.names)
        self.blobs = blobs

    async def command(self, name: str, body: bytes, *, timeout_s: float = 30.0, msg_id: str | None = None) -> Reply:
        """Publish one command and wait for its reply.

        Raises:
            CommandTimeout: the command is queued but no service answered within ``timeout_s``.
            ReelError: the commands stream does not exist (no Reel service ever ran here).
        """
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, max_msgs=1)
        headers = {REPLY_TO_HEADER: inbox}
        if msg_id:
            headers[MSG_ID_HEADER] = msg_id
        try:
            try:
                await self.js.publish(self.cfg.names.command(name), body, headers=headers)
            except NoStreamResponseError as exc:
                raise ReelError(f"no {self.cfg.names.commands_stream} stream at {self.cfg.nats_url}: "
                                "is `reel up` (or a Reel service) running?") from exc
            try:
                msg = await sub.next_msg(timeout=timeout_s)
            except Exception as exc:
                raise CommandTimeout(f"no answer to {name} within {timeout_s}s (the command stays queued)") from exc
        finally:
            await sub.unsubscribe()
        return msgspec.json.decode(msg.data, type=Reply)

    async def start(self, spec: WorkflowSpec, *, idempotency_key: str | None = None,
                    labels: dict[str, str] | None = None, timeout_s: float = 30.0) -> Reply:
        """Start a run of ``spec``; large workflows go by blob ref."""
        body = encode_workflow(spec)
        if len(body) > INLINE_WORKFLOW_MAX_BYTES and self.blobs is not None:
            ref = await self.blobs.put(body, "application/json")
            cmd = StartRun(workflow_ref=ref, idempotency_key=idempotency_key, labels=labels or {})
        else:
            cmd = StartRun(workflow=spec, idempotency_key=idempotency_key, labels=labels or {})
        return await self.command("start", encode(cmd), timeout_s=timeout_s, msg_id=uuid.uuid4().hex)

    async def cancel(self, run_id: str, reason: str = "", *, timeout_s: float = 30.0) -> Reply:
        """Cancel a run."""
        return await self.command("cancel", encode(CancelRun(run_id=RunId(run_id), reason=reason)), timeout_s=timeout_s)

    async def rewind(self, run_id: str, *, at_step: str | None = None, at_lsn: int | None = None,
                     branch: str | None = None, idempotency_key: str | None = None,
                     timeout_s: float = 30.0) -> Reply:
        """Fork a new branch of a run at a step or LSN."""
        cmd = RewindRun(run_id=RunId(run_id), at_step=None if at_step is None else StepId(at_step),
                        at_lsn=None if at_lsn is None else LSN(at_lsn),
                        branch=None if branch is None else BranchId(branch), idempotency_key=idempotency_key)
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
            RunCorrupt: the run is, or becomes, corrupt (:mod:`shared.core.integrity`).
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
