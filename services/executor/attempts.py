"""The executor's attempt machinery: fenced commits, outputs, recovery markers.

Per attempt the executor commits the intent (``attempt_dispatched``, with the prompt
ref and the ContextPartition of a model step) *before* the side effect (the model call
or the tool run), and the outcome after (plain steps: services/executor/plain.py, where
the outcome and the next intent share one commit; agent steps: agent.py). A success's
output goes to the blob store (or inline in its ref) and, where recovery needs it, keyed
by ``<run>.<branch>.<step>.<attempt>``, to the outcomes KV bucket (the recovery marker:
if the outcome commit is lost with this process, recovery finds the output there).

Every commit goes through :func:`reel.shared.application.fenced.commit_decided`, fenced on the head of
the state the executor materialized (never a re-read of the run). Two decisions:

* an intent (and the driver's claim and ``run_verifying``) was planned on one head
  and is committed only on that head (:func:`on_head`); if someone else committed
  first, the result is the :class:`~reel.shared.application.fenced.Decided` that committed nothing (a Skip), with the
  run
  as it is now,
  and the driver plans again (services/executor/driver.py);
* an outcome is a fact about an attempt whose side effect happened: it is recorded on
  top of whatever was committed meanwhile (a cancel, a rewind, recovery), unless the
  attempt was resolved meanwhile (:func:`reel.shared.core.run.planning.outcome_recorded`).

Every commit (and every pipelined first try) is filtered by
:func:`reel.shared.core.mutators.cancel.after_cancel` on the state it is decided on: on a cancelled run an
outcome is recorded ``attempt_cancelled`` and nothing else goes in. The side effect of an
attempt is stopped when the drive's interrupt fires (services/executor/interrupts.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence
from typing import Any, NoReturn

import msgspec
import structlog
import tenacity
from nats.aio.client import Client
from nats.js.kv import KeyValue

from reel.shared.application.fenced import Committed, Decide, Decided, Sent, commit_decided
from reel.shared.application.workspace import WorkingCopies, WorkspaceTooLarge
from reel.shared.core.decision import Decision, Skip, events_or_skip
from reel.shared.core.errors import ToolError
from reel.shared.core.mutators.cancel import after_cancel
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.ports import BlobStore, EventLog
from reel.shared.core.run import planning as plan
from reel.shared.core.run.crashpoints import CRASH_ENV, CRASH_SIGNAL_ENV
from reel.shared.core.run.events import AnyEvent, AttemptFailed, AttemptSucceeded, BlobRef, RunStarted
from reel.shared.core.run.ids import BranchId, ExecutorId, StepId, new_commit_id
from reel.shared.core.run.state import RunState, final_success
from reel.shared.core.wire.subjects import Names, outcome_key
from reel.shared.core.workflow.spec import WorkspaceSpec
from reel.shared.core.workflow.toolspec import OutputLimit, truncation_note
from reel.shared.nats.blobstore import ref_for
from reel.shared.nats.leases import Lease
from reel.shared.nats.markers import KvOutcomeMarkers
from reel.shared.nats.publish import publish_pipelined, publish_verify
from reel.shared.proc.group import Stdin
from reel.shared.proc.tools import SPOOL_MEMORY_BYTES, ToolOutput

from .bodies import Bodies
from .streaming import StreamOut

log = structlog.get_logger("reel.executor")

BLOB_TIMEOUT_S = 30.0
MARKER_CREATE = {"Nats-Expected-Last-Subject-Sequence": "0"}
"""An outcome marker is only ever created, never overwritten: once recovery has claimed an attempt's key (its
``lost`` tombstone, written before it records the attempt lost), a late marker of that attempt is refused."""
LOG_NAME = "executor"  # lost fences are logged as ``executor.conflict`` (shared/application/fenced.py)


OUTPUT_READ_MAX_BYTES = 4 * 1024 * 1024
"""An earlier output longer than this is read as its head and tail only (bytes; a model step passes its own
bound, :func:`reel.shared.core.run.planning.read_bound`)."""


class Outputs(dict[str, str]):
    """Earlier outputs' texts by step id (:meth:`Attempts.outputs`); ``trimmed``: step id → the full size
    (bytes) of each output of which only the head and tail were read."""

    def __init__(self, texts: dict[str, str], trimmed: dict[str, int] | None = None) -> None:
        super().__init__(texts)
        self.trimmed: dict[str, int] = dict(trimmed or {})


RUN_MOVED = Skip("run moved")
"""An intent planned on one head, decided on another: never committed (the driver plans again)."""
OUTCOME_RECORDED = Skip("outcome already recorded")
"""An outcome whose attempt was resolved meanwhile (by recovery, or an earlier try)."""
TAKEN_OVER = Skip("run taken over")
"""Anything but a claim, decided on a run another executor claimed since: never committed (the drive stops)."""


def on_head(head_lsn: int, events: Sequence[AnyEvent]) -> Decide:
    """Decide ``events`` only on the head they were planned on (``head_lsn``); else "run moved"."""
    planned = tuple(events)

    def decide(state: RunState) -> Decision:
        return planned if state.head_lsn == head_lsn else RUN_MOVED
    return decide


def settled(decide: Decide) -> Decide:
    """``decide``, its events filtered by :func:`reel.shared.core.mutators.cancel.after_cancel` (nothing left: a
        Skip)."""
    def decided(state: RunState) -> Decision:
        out = decide(state)
        if isinstance(out, Skip):
            return out
        return events_or_skip(after_cancel(state, out), "run cancelled")
    return decided


def record_outcome(event: AttemptSucceeded | AttemptFailed) -> Decide:
    """Decide ``event`` on any head, unless the attempt's outcome is recorded already (pure)."""
    def decide(state: RunState) -> Decision:
        if plan.outcome_recorded(state, event.branch_id, event.step_id, event.attempt):
            return OUTCOME_RECORDED
        return (event,)
    return decide


def die(point: str) -> NoReturn:
    """Fault injection: log ``executor.crash_injected`` and end the process at once, as kill -9 would: a real
    SIGKILL with ``REEL_EXECUTOR_CRASH_SIGNAL=KILL`` (:data:`CRASH_SIGNAL_ENV`), else ``os._exit(137)``."""
    log.error("executor.crash_injected", point=point)
    if os.environ.get(CRASH_SIGNAL_ENV) == "KILL":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


class Attempts:
    """Performs attempts for one executor: its id, the event log, the blob store, the marker bucket.

    Args:
        log: the event log every commit goes to (fenced, written as ``executor_id``).
        blobs: where prompts and outputs go (content-addressed).
        nc: the connection the recovery markers are published on (``names.outcome_marker``).
        counter: token counter of the packer's candidates.
        outcomes: the outcome-marker bucket, to read a dead executor's markers (:meth:`marker`).
        tool_output: the default output cap of a ``command`` tool step (``REEL_TOOL_MAX_OUTPUT_BYTES``,
            ``REEL_TOOL_ON_OVERFLOW``); a tool's own ``max_output_bytes``/``on_overflow`` win.
        lease: this executor's lease (:class:`~reel.shared.nats.leases.Lease`): checked right before every commit,
            outcome marker, verification trigger and snapshot, so an executor that lost its lease writes
            nothing (:class:`~reel.shared.core.errors.LeaseLost` is raised instead); ``None``: not checked.
    """

    def __init__(self, log: EventLog, blobs: BlobStore, nc: Client, names: Names,
                 executor_id: ExecutorId, counter: TokenCounter, *, outcomes: KeyValue | None = None,
                 tool_output: OutputLimit | None = None, lease: Lease | None = None) -> None:
        self.log, self.blobs, self._nc, self._names = log, blobs, nc, names
        self._js = nc.jetstream()  # one context for the verify triggers (building one per run showed in profiles)
        self._markers = KvOutcomeMarkers(outcomes) if outcomes is not None else None
        self.lease = lease
        self.tool_output = tool_output or OutputLimit()
        self.executor_id = executor_id
        self.counter = counter
        self.facts = plan.TextFacts(counter)
        self.workspaces = WorkingCopies(blobs)  # the branches' working copies (docs/workspaces.md)
        self.bodies = Bodies(blobs)  # the executor's one cache of blob bodies (outputs, turns, results)
        self._crash_at = os.environ.get(CRASH_ENV, "")

    def crash_if(self, *points: str) -> None:
        """Fault injection (:data:`CRASH_ENV`): die at once (:func:`die`) if the point set is one of ``points``."""
        if self._crash_at and self._crash_at in points:
            die(self._crash_at)

    def check_lease(self) -> None:
        """Raise :class:`~reel.shared.core.errors.LeaseLost` unless this executor still holds its lease."""
        if self.lease is not None:
            self.lease.check()

    # ---- workspaces ----------------------------------------------------------------------
    async def snapshot(self, state: RunState, branch_id: BranchId, spec: WorkspaceSpec | msgspec.UnsetType
                       ) -> tuple[BlobRef | msgspec.UnsetType, ToolError | None]:
        """Snapshot the branch's working copy after tool calls (an agent's, or a tool step's) ended: the manifest
        when it changed (else unset; unset too for a workflow with no workspace), or the error that fails the
        calls (the workspace grew past its limits: ``workspace_too_large``, not retryable)."""
        if isinstance(spec, msgspec.UnsetType):
            return msgspec.UNSET, None
        try:
            ref = await self.workspaces.record(state, branch_id, spec)
        except WorkspaceTooLarge as exc:
            log.warning("workspace.too_large", branch_id=branch_id, reason=exc.message)
            return msgspec.UNSET, ToolError(exc.message, kind=exc.code, retryable=False)
        return (msgspec.UNSET if ref is None else ref), None

    # ---- commits -------------------------------------------------------------------------
    async def send(self, state: RunState, events: Sequence[AnyEvent]) -> Sent | None:
        """Send the commit of ``events`` fenced on ``state.head_lsn`` now (to pipeline it), for :meth:`commit`.

        The events sent are filtered as :meth:`commit` decides them (:func:`settled`); ``None``:
        nothing is left to send on ``state`` (a cancelled run), the commit decides alone.
        """
        kept = after_cancel(state, events)
        if not kept:
            return None
        self.check_lease()
        cid = new_commit_id()
        lsn = await self.log.commit_async(state.run_id, kept, expected_lsn=state.head_lsn, writer=self.executor_id,
                                          commit_id=cid)
        return Sent(events=tuple(kept), commit_id=cid, lsn=lsn)

    async def send_with(self, state: RunState, events: Sequence[AnyEvent], bodies: Sequence[tuple[bytes, str]] = (),
                        markers: Sequence[AttemptSucceeded] = (), *, crash_point: str | Sequence[str] = "",
                        ) -> Sent | None:
        """One round trip before a commit: store ``bodies`` (``(body, media type)``), publish the recovery
        markers of the ``markers`` successes, then :meth:`send` ``events`` — all pipelined on one connection,
        so the server has them before the commit. Then each body the store refused is written again
        (:meth:`store_until_done`: the commit may name it) and a lost marker is logged (it only matters
        if the commit is lost too). Returns :meth:`send`'s future.

        ``crash_point``: fault injection (``REEL_EXECUTOR_CRASH_AT``): if the point set is it (or one of them),
        the process dies (:func:`die`) once the bodies and markers are stored, before the commit is sent.
        """
        self.check_lease()
        puts = [await self.blobs.put_async(b, media) for b, media in bodies]
        marks = [self.marker_async(state.run_id, o.branch_id, o.step_id, o.attempt, o.output_ref) for o in markers]
        armed = (crash_point,) if isinstance(crash_point, str) else crash_point
        if self._crash_at and self._crash_at in armed:
            await asyncio.gather(*puts, *marks)
            die(self._crash_at)
        sent = await self.send(state, events)
        stored = await asyncio.gather(*puts, *marks, return_exceptions=True)
        for result, (body, media) in zip(stored, bodies, strict=False):
            if isinstance(result, BaseException):
                log.warning("attempt.output_rewrite", error=str(result))
                await self.store_until_done(body, media)
        for mark in stored[len(puts):]:
            if isinstance(mark, BaseException):
                log.warning("attempt.marker_failed", error=str(mark))
        return sent

    async def commit(self, state: RunState, decide: Decide, *, sent: Sent | None = None,
                     ) -> Committed | Decided:
        """Commit what ``decide`` says on ``state``: the commit, or the
        :class:`~reel.shared.application.fenced.Decided` that committed nothing (its ``state``: the run as it is
        now). ``sent``: its first try, in flight already (:meth:`send`); ``decide`` is asked only after a lost
        fence.

        Raises:
            ConcurrencyConflict: the fence was lost on every try of the one retry policy.
            LeaseLost: this executor lost its lease (nothing is committed).
        """
        done = await commit_decided(self.log, state.run_id, self._leased(self._owned(settled(decide))),
                                    writer=self.executor_id, state=state, sent=sent, log_name=LOG_NAME)
        return done.commit if done.commit is not None else done

    def _owned(self, decide: Decide) -> Decide:
        """``decide``, but nothing on a run another executor has claimed since (it was taken over: this executor
        lost it and writes nothing more to it) — unless what it decides is this executor's claim."""
        def decided(state: RunState) -> Decision:
            out = decide(state)
            if isinstance(out, Skip) or state.executor_id in (None, self.executor_id):
                return out
            if any(isinstance(e, RunStarted) and e.executor_id == self.executor_id for e in out):
                return out
            return TAKEN_OVER
        return decided

    def _leased(self, decide: Decide) -> Decide:
        """``decide``, with the lease checked on every try (a try after a lost fence may come late)."""
        def decided(state: RunState) -> Decision:
            out = decide(state)
            if not isinstance(out, Skip):
                self.check_lease()
            return out
        return decided

    async def intent(self, state: RunState, events: Sequence[AnyEvent], *,
                     sent: Sent | None = None) -> RunState | Decided:
        """Commit ``events`` planned on ``state``: the state after them, or the Decided that committed nothing
        (the run moved)."""
        done = await self.commit(state, on_head(state.head_lsn, events), sent=sent)
        return done.state if isinstance(done, Committed) else done

    async def trigger_verification(self, state: RunState) -> None:
        """Queue the verifier's trigger for the ``run_verifying`` commit at ``state.head_lsn`` (best effort:
        if it is lost, recovery's sweep re-triggers a run resting in Verifying with none queued)."""
        if self._crash_at == "verifying:after_commit":  # fault injection: die between the commit and the trigger
            die(self._crash_at)
        self.check_lease()
        try:
            await publish_verify(self._js, self._names, state.run_id, state.active_branch, state.head_lsn)
        except Exception as exc:
            log.warning("run.verify_trigger_failed", lsn=state.head_lsn, error=str(exc))

    # ---- outputs -------------------------------------------------------------------------
    async def tool_body(self, out: ToolOutput, inline_max: int) -> tuple[BlobRef, bytes | None]:
        """A tool output's ref, and its body if it is small (read into memory, kept in :attr:`bodies`, inline
        in its ref if at most ``inline_max`` bytes); a large one (over
        :data:`~reel.shared.proc.tools.SPOOL_MEMORY_BYTES`)
        is streamed from its spool into the blob store now (``put_file``, three tries) and its body is ``None``:
        it is never held whole. The spool is closed.

        Raises:
            ToolError: ``output_store_failed`` (retryable): a large output could not be stored.
        """
        with out:
            if out.size_bytes <= SPOOL_MEMORY_BYTES:
                body = out.read()
                ref = ref_for(body, inline_max=inline_max)
                self.bodies.keep(body, ref)
                return ref, body
            ref = BlobRef(sha256=out.sha256, size_bytes=out.size_bytes)
            try:
                async for attempt in tenacity.AsyncRetrying(stop=tenacity.stop_after_attempt(3), reraise=True,
                                                            wait=tenacity.wait_exponential(max=2)):
                    with attempt:
                        await self.blobs.put_file(out.file(), ref)
            except Exception as exc:
                raise ToolError(f"the output ({out.size_bytes} bytes) could not be stored: {exc}"[:2000],
                                kind="output_store_failed") from exc
            return ref, None

    def stdin_of(self, state: RunState, branch_id: BranchId, step_id: str) -> Stdin:
        """A command's stdin (``stdin_from``): the output of ``step_id``'s final success on ``branch_id``, the
        bytes as stored — a body in :attr:`bodies` as it is, any other streamed from the blob store chunk by
        chunk (checked against its sha256 as it goes: :meth:`~reel.shared.nats.blobread.BlobReads.chunks`; never
        held whole); ``b""`` if the step has no output."""
        ref = plan.succeeded_output(state, branch_id, StepId(step_id))
        if ref is None:
            return b""
        body = self.bodies.peek(ref)
        return body if body is not None else self.blobs.chunks(ref)

    async def outputs(self, state: RunState, branch_id: BranchId, step_ids: list[str], *,
                      max_bytes: int = OUTPUT_READ_MAX_BYTES) -> Outputs:
        """Output texts of earlier steps that succeeded on ``branch_id`` (what a model is shown): step id →
        text (UTF-8, invalid bytes replaced); a tool output its cap truncated ends with
        :func:`~reel.shared.core.workflow.toolspec.truncation_note`. One of at most ``max_bytes`` comes from
        :attr:`bodies`
        (the ones it lacks read from the blob store concurrently); a longer one is never read whole: only
        its first and last ``max_bytes // 2`` (one streamed pass, checked against its sha256:
        :meth:`~reel.shared.nats.blobread.BlobReads.head_tail`), marked where bytes were left out
        (:func:`~reel.shared.core.run.planning.trimmed_text`) and listed in :attr:`Outputs.trimmed`.

        Raises:
            BlobMissing, BlobCorrupt, BlobTimeout: an output's blob cannot be read.
        """
        found = {sid: plan.succeeded_output(state, branch_id, StepId(sid)) for sid in step_ids}
        refs = {sid: ref for sid, ref in found.items() if ref is not None}
        large = {sid: ref for sid, ref in refs.items() if ref.size_bytes > max_bytes}
        bodies = await self.bodies.many([ref for sid, ref in refs.items() if sid not in large])
        half = max_bytes // 2
        ends = await asyncio.gather(*(self._ends(r, half, max_bytes - half) for r in large.values()))
        texts = Outputs({sid: bodies[ref.sha256].decode("utf-8", errors="replace")
                         for sid, ref in refs.items() if sid not in large})
        for sid, (head, tail, size) in zip(large, ends, strict=True):
            texts[sid] = plan.trimmed_text(head, tail, size)
            texts.trimmed[sid] = size
        for sid, ref in refs.items():
            win = final_success(state.branches[branch_id].attempts.get(StepId(sid), ()))
            if win is not None and win.truncated is True:
                texts[sid] += truncation_note(ref.size_bytes)
        return Outputs({sid: texts[sid] for sid in refs}, texts.trimmed)  # in the order asked

    async def _ends(self, ref: BlobRef, head: int, tail: int) -> tuple[bytes, bytes, int]:
        """The head and tail of a body (bytes) and its size: sliced from :attr:`bodies` if it is there, else
        streamed from the store (:meth:`~reel.shared.nats.blobread.BlobReads.head_tail`)."""
        body = self.bodies.peek(ref)
        if body is None:
            return await self.blobs.head_tail(ref, head, tail)
        return body[:head], body[max(head, len(body) - tail):], len(body)

    # ---- outcomes ------------------------------------------------------------------------
    async def marker(self, run_id: str, branch_id: str, step_id: str, attempt: int) -> BlobRef | None:
        """The output ref a (dead) executor stored for this attempt before its outcome commit, if any."""
        if self._markers is None:
            return None
        return await self._markers.read(outcome_key(run_id, branch_id, step_id, attempt))

    def stream_out(self, run_id: str, branch_id: str, step_id: str, attempt: int, streams: bool) -> StreamOut | None:
        """Where attempt ``attempt`` of a model call streams its response if its model spec streams, else ``None``."""
        return StreamOut(self._nc, self._names.stream(run_id, branch_id, step_id, attempt)) if streams else None

    def marker_async(self, run_id: str, branch_id: str, step_id: str, attempt: int,
                     ref: BlobRef) -> asyncio.Future[Any]:
        """Publish the recovery marker of a success (its output ``ref``) now; the future resolves once acked."""
        self.check_lease()
        key = outcome_key(run_id, branch_id, step_id, attempt)
        fut: asyncio.Future[Any] = publish_pipelined(self._nc, self._names.outcome_marker(key),
                                                        msgspec.json.encode(ref), MARKER_CREATE, BLOB_TIMEOUT_S)
        return fut

    async def store_until_done(self, body: bytes, media_type: str = "text/plain") -> None:
        """Write a blob whose ref is (about to be) committed, retrying with backoff until it is stored."""
        async for attempt in tenacity.AsyncRetrying(wait=tenacity.wait_exponential(max=10), reraise=True,
                                                    stop=tenacity.stop_after_delay(600)):
            with attempt:
                await self.blobs.put(body, media_type)
