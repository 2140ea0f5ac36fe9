"""One attempt of a step: the intent commit, the side effect, the outcome commit (brief §3, §4).

Per attempt the executor commits the intent (``attempt_dispatched``, with the prompt
blob ref and the ContextPartition of a model step, in one commit) *before* the side
effect (the model call or the tool run), and the outcome after. The output goes to
the blob store and, keyed by ``<run>.<branch>.<step>.<attempt>``, to the outcomes KV
bucket (the recovery marker: if the outcome commit is lost with this process,
recovery finds the output there).

Every commit goes through :func:`shared.fenced.commit_decided`, fenced on the head of
the state the executor materialized (never a re-read of the run). Two decisions:

* an intent (and the driver's claim and ``run_verifying``) was planned on one head
  and is committed only on that head (:func:`on_head`); if someone else committed
  first, the result is :class:`~shared.fenced.NoCommit` with the run as it is now,
  and the driver plans again (services/executor/driver.py);
* an outcome is a fact about an attempt whose side effect happened: it is recorded on
  top of whatever was committed meanwhile (a cancel, a rewind, recovery), unless the
  attempt was resolved meanwhile (:func:`shared.core.planning.outcome_recorded`).

Every commit (and every pipelined first try) is filtered by
:func:`shared.core.cancel.after_cancel` on the state it is decided on: on a cancelled run an
outcome is recorded ``attempt_cancelled`` and nothing else goes in. The side effect of an
attempt is stopped when the drive's interrupt fires (services/executor/interrupts.py).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec
import structlog
import tenacity
from nats.aio.client import Client
from nats.js.errors import InvalidKeyError, KeyNotFoundError
from nats.js.kv import KeyValue

from shared.clock import now_ms
from shared.core import planning as plan
from shared.core.cancel import after_cancel
from shared.core.errors import ModelError, ToolError
from shared.core.events import (
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    Usage,
)
from shared.core.fold import RunState
from shared.core.ids import BranchId, ExecutorId, StepId
from shared.core.packer import pack
from shared.core.ports import BlobStore, EventLog
from shared.core.subjects import Names, outcome_key
from shared.core.tokens import TokenCounter
from shared.core.workflow import ModelStep, ToolStep, WorkflowSpec
from shared.fenced import Committed, Decide, NoCommit, commit_decided
from shared.models import ModelRequest, make_adapter
from shared.nats.blobstore import ref_for
from shared.nats.control import Interrupt
from shared.nats.publish import publish_pipelined, publish_verify
from shared.proc.tools import run_tool

from .interrupts import Interrupted, guarded

log = structlog.get_logger("reel.executor")

TEXT_CACHE_BYTES = 64 * 1024 * 1024
BLOB_TIMEOUT_S = 30.0
CRASH_ENV = "REEL_EXECUTOR_CRASH_AT"  # fault injection: "<step_id>:<attempt>:after_output", "verifying:after_commit"
LOG_NAME = "executor"  # lost fences are logged as ``executor.conflict`` (shared/fenced.py)


def on_head(head_lsn: int, events: Sequence[AnyEvent]) -> Decide:
    """Decide ``events`` only on the head they were planned on (``head_lsn``); else "run moved"."""
    def decide(state: RunState) -> Sequence[AnyEvent] | NoCommit:
        return events if state.head_lsn == head_lsn else NoCommit(reason="run moved", state=state)
    return decide


def settled(decide: Decide) -> Decide:
    """``decide``, its events filtered by :func:`shared.core.cancel.after_cancel` (nothing left: NoCommit)."""
    def decided(state: RunState) -> Sequence[AnyEvent] | NoCommit:
        out = decide(state)
        if isinstance(out, NoCommit):
            return out
        kept = after_cancel(state, out)
        return kept if kept else NoCommit(reason="run cancelled", state=state)
    return decided


def record_outcome(event: AttemptSucceeded | AttemptFailed) -> Decide:
    """Decide ``event`` on any head, unless the attempt's outcome is recorded already (pure)."""
    def decide(state: RunState) -> Sequence[AnyEvent] | NoCommit:
        if plan.outcome_recorded(state, event.branch_id, event.step_id, event.attempt):
            return NoCommit(reason="outcome already recorded", state=state)
        return (event,)
    return decide


class Attempts:
    """Performs attempts for one executor: its id, the event log, the blob store, the marker bucket.

    Args:
        log: the event log every commit goes to (fenced, written as ``executor_id``).
        blobs: where prompts and outputs go (content-addressed).
        nc: the connection the recovery markers are published on (``names.outcome_marker``).
        counter: token counter of the packer's candidates.
        outcomes: the outcome-marker bucket, to read a dead executor's markers (:meth:`marker`).
    """

    def __init__(self, log: EventLog, blobs: BlobStore, nc: Client, names: Names,
                 executor_id: ExecutorId, counter: TokenCounter, *, outcomes: KeyValue | None = None) -> None:
        self.log, self.blobs, self._nc, self._names, self._outcomes = log, blobs, nc, names, outcomes
        self.executor_id = executor_id
        self.counter = counter
        self.facts = plan.TextFacts(counter)
        self._texts: OrderedDict[str, str] = OrderedDict()  # sha256 → output text, LRU
        self._texts_bytes = 0
        self._crash_at = os.environ.get(CRASH_ENV, "")

    # ---- commits -------------------------------------------------------------------------
    async def send(self, state: RunState, events: Sequence[AnyEvent]) -> asyncio.Future[int] | None:
        """Send the commit of ``events`` fenced on ``state.head_lsn`` now (to pipeline it); its LSN future.

        The events sent are filtered as :meth:`commit` decides them (:func:`settled`); ``None``:
        nothing is left to send on ``state`` (a cancelled run), the commit decides alone.
        """
        kept = after_cancel(state, events)
        if not kept:
            return None
        return await self.log.commit_async(state.run_id, kept, expected_lsn=state.head_lsn, writer=self.executor_id)

    async def commit(self, state: RunState, decide: Decide, *, sent: asyncio.Future[int] | None = None,
                     ) -> Committed | NoCommit:
        """Commit what ``decide`` says on ``state`` (``sent``: its first try, in flight already).

        Raises:
            ConcurrencyConflict: the fence was lost on every try of the one retry policy.
        """
        return await commit_decided(self.log, state.run_id, settled(decide), writer=self.executor_id, state=state,
                                    sent=sent, log_name=LOG_NAME)

    async def intent(self, state: RunState, events: Sequence[AnyEvent], *,
                     sent: asyncio.Future[int] | None = None) -> RunState | NoCommit:
        """Commit ``events`` planned on ``state``: the state after them, or NoCommit (the run moved)."""
        done = await self.commit(state, on_head(state.head_lsn, events), sent=sent)
        return done.state if isinstance(done, Committed) else done

    async def trigger_verification(self, state: RunState) -> None:
        """Queue the verifier's trigger for the ``run_verifying`` commit at ``state.head_lsn`` (best effort:
        if it is lost, recovery's sweep re-triggers a run resting in Verifying with none queued)."""
        if self._crash_at == "verifying:after_commit":  # fault injection: die between the commit and the trigger
            log.error("executor.crash_injected", point=self._crash_at)
            os._exit(137)
        try:
            await publish_verify(self._nc.jetstream(), self._names, state.run_id, state.active_branch, state.head_lsn)
        except Exception as exc:
            log.warning("run.verify_trigger_failed", lsn=state.head_lsn, error=str(exc))

    # ---- attempts ------------------------------------------------------------------------
    async def model(self, state: RunState, spec: WorkflowSpec, step: ModelStep, action: plan.Dispatch,
                    interrupt: Interrupt | None = None) -> RunState | NoCommit:
        """Pack the context, commit the intent with the prompt blob, call the model, record the outcome.

        ``interrupt``: when it fires, the model call is aborted and the attempt recorded at once.
        Returns the state after the outcome, or NoCommit if the intent lost its fence (nothing was called).
        """
        outputs = await self.outputs(state, action.branch_id, plan.needed_outputs(step, spec))
        items = plan.context_items(step, spec, outputs)
        packed = pack(plan.candidates(items, self.facts), plan.policy_for(step, spec))
        prompt = plan.render_prompt(step, items, packed.partition.packed)
        body = prompt.encode()
        prompt_ref = ref_for(body)
        intent = AttemptDispatched(
            branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt, executor_id=self.executor_id,
            at_ms=now_ms(), prompt_ref=prompt_ref, context=packed.partition,
        )
        # the prompt blob and the intent go out in one round trip (the ref is computed locally); the model
        # is called only once both are acked, so no side effect ever follows an intent whose prompt is missing
        prompt_fut = await self.blobs.put_async(body)
        intent_fut = await self.send(state, [intent])
        blob_result, = await asyncio.gather(prompt_fut, return_exceptions=True)
        done = await self.intent(state, [intent], sent=intent_fut)
        if isinstance(done, NoCommit):
            return done
        state = done
        if isinstance(blob_result, BaseException):
            return await self._fail(state, action, "prompt_store_failed", str(blob_result), True, Usage())
        p = packed.partition
        log.debug("attempt.dispatched", lsn=state.head_lsn, packed=len(p.packed), available=len(p.available),
                 dropped=len(p.dropped), prompt_tokens=packed.packed_tokens)
        started = time.perf_counter()
        try:
            adapter = make_adapter(step.model, self.counter)
            request = ModelRequest(run_id=state.run_id, step_id=step.id, attempt=action.attempt, prompt=prompt,
                                   prompt_tokens=packed.packed_tokens)
            instant = step.model.adapter in ("replay", "scripted")
            resp = await guarded(adapter.complete(request), None if instant else interrupt)
        except (ModelError, Interrupted) as exc:
            usage = Usage(input_tokens=packed.packed_tokens, latency_ms=_ms_since(started), cost_usd=exc.cost_usd)
            return await self._fail(state, action, exc.kind, exc.message, exc.retryable, usage)
        usage = Usage(input_tokens=resp.input_tokens, output_tokens=resp.output_tokens,
                      latency_ms=_ms_since(started), cost_usd=resp.cost_usd)
        return await self._succeed(state, action, resp.text, usage)

    async def tool(self, state: RunState, step: ToolStep, action: plan.Dispatch,
                   interrupt: Interrupt | None = None) -> RunState | NoCommit:
        """Commit the intent, run the tool, record the outcome (``interrupt``: as :meth:`model`; a command's
        process group is killed).

        Returns the state after the outcome, or NoCommit if the intent lost its fence (the tool was not run).
        """
        intent = AttemptDispatched(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                   executor_id=self.executor_id, at_ms=now_ms())
        done = await self.intent(state, [intent])
        if isinstance(done, NoCommit):
            return done
        state = done
        log.debug("attempt.dispatched", lsn=state.head_lsn, tool=step.tool.type)
        stdin = None
        if step.tool.stdin_from:
            stdin = (await self.outputs(state, action.branch_id, [step.tool.stdin_from])).get(
                step.tool.stdin_from, "").encode()
        started = time.perf_counter()
        try:
            text = await guarded(run_tool(step.tool, attempt=action.attempt, stdin=stdin, env={
                "REEL_RUN_ID": state.run_id, "REEL_BRANCH_ID": action.branch_id, "REEL_STEP_ID": step.id,
                "REEL_ATTEMPT": str(action.attempt)}), interrupt if step.tool.type == "command" else None)
        except (ToolError, Interrupted) as exc:
            return await self._fail(state, action, exc.kind, exc.message, exc.retryable,
                                    Usage(latency_ms=_ms_since(started)))
        return await self._succeed(state, action, text, Usage(latency_ms=_ms_since(started)))

    # ---- outputs -------------------------------------------------------------------------
    def _remember_text(self, sha: str, text: str) -> None:
        if sha in self._texts:
            self._texts.move_to_end(sha)
            return
        self._texts[sha] = text
        self._texts_bytes += len(text)
        while self._texts_bytes > TEXT_CACHE_BYTES and len(self._texts) > 1:
            _, old = self._texts.popitem(last=False)
            self._texts_bytes -= len(old)

    async def outputs(self, state: RunState, branch_id: BranchId, step_ids: list[str]) -> dict[str, str]:
        """Output texts of earlier steps (from this executor's LRU, else the blob store); step id → text.

        Raises:
            BlobMissing: an output's blob is gone from the store.
        """
        out: dict[str, str] = {}
        for sid in step_ids:
            ref = plan.succeeded_output(state, branch_id, StepId(sid))
            if ref is None:
                continue
            text = self._texts.get(ref.sha256)
            if text is None:
                text = await self.blobs.get_text(ref)
            self._remember_text(ref.sha256, text)
            out[sid] = text
        return out

    # ---- outcomes ------------------------------------------------------------------------
    async def _succeed(self, state: RunState, action: plan.Dispatch, text: str, usage: Usage) -> RunState:
        """Store the output, its recovery marker and the outcome commit in one round trip.

        The three go out together on one connection, so the server stores the blob
        and the marker before it sees the commit. If the blob write is refused while
        the commit lands, the blob is written again (the ref is content-addressed,
        so the commit's ref becomes valid) before the run moves on.
        """
        body = text.encode()
        ref = ref_for(body)
        self._remember_text(ref.sha256, text)
        key = outcome_key(state.run_id, action.branch_id, action.step_id, action.attempt)
        blob_fut = await self.blobs.put_async(body)
        marker_fut = publish_pipelined(self._nc, self._names.outcome_marker(key),
                                       msgspec.json.encode(ref), None, BLOB_TIMEOUT_S)
        if self._crash_at == f"{action.step_id}:{action.attempt}:after_output":
            await asyncio.gather(blob_fut, marker_fut)
            log.error("executor.crash_injected", point=self._crash_at)
            os._exit(137)
        event = AttemptSucceeded(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                 output_ref=ref, usage=usage, at_ms=now_ms())
        fut = await self.send(state, [event])
        stored = await asyncio.gather(blob_fut, marker_fut, return_exceptions=True)
        if isinstance(stored[0], BaseException):
            log.warning("attempt.output_rewrite", error=str(stored[0]))
            await self.store_until_done(body)
        if isinstance(stored[1], BaseException):  # the marker only matters if the commit is lost too
            log.warning("attempt.marker_failed", error=str(stored[1]))
        state = await self._outcome(state, fut, event)
        log.info("attempt.succeeded", lsn=state.head_lsn, output_bytes=len(body),
                 input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                 latency_ms=round(usage.latency_ms, 3))
        return state

    async def marker(self, run_id: str, branch_id: str, step_id: str, attempt: int) -> BlobRef | None:
        """The output ref a (dead) executor stored for this attempt before its outcome commit, if any."""
        if self._outcomes is None:
            return None
        try:
            entry = await self._outcomes.get(outcome_key(run_id, branch_id, step_id, attempt))
            return msgspec.json.decode(entry.value or b"", type=BlobRef)
        except (KeyNotFoundError, InvalidKeyError, msgspec.ValidationError, msgspec.DecodeError):
            return None

    def marker_async(self, run_id: str, branch_id: str, step_id: str, attempt: int,
                     ref: BlobRef) -> asyncio.Future[Any]:
        """Publish the recovery marker of a success (its output ``ref``) now; the future resolves once acked."""
        key = outcome_key(run_id, branch_id, step_id, attempt)
        fut: asyncio.Future[Any] = publish_pipelined(self._nc, self._names.outcome_marker(key),
                                                        msgspec.json.encode(ref), None, BLOB_TIMEOUT_S)
        return fut

    async def store_until_done(self, body: bytes, media_type: str = "text/plain") -> None:
        """Write a blob whose ref is (about to be) committed, retrying with backoff until it is stored."""
        async for attempt in tenacity.AsyncRetrying(wait=tenacity.wait_exponential(max=10), reraise=True,
                                                    stop=tenacity.stop_after_delay(600)):
            with attempt:
                await self.blobs.put(body, media_type)

    async def _outcome(self, state: RunState, fut: asyncio.Future[int] | None,
                       event: AttemptSucceeded | AttemptFailed) -> RunState:
        """Settle an outcome commit (``fut``: its first try, in flight). If someone else committed
        while the side effect ran (a cancel, a rewind, recovery), the outcome is still a fact about
        this attempt: it is recorded on top of their commit, unless the attempt was resolved
        meanwhile (:func:`record_outcome`). Never drops an outcome silently.

        Raises:
            ConcurrencyConflict: the fence was lost on every try of the one retry policy.
        """
        done = await self.commit(state, record_outcome(event), sent=fut)
        if isinstance(done, NoCommit):
            log.info("attempt.outcome_already_recorded", lsn=done.state.head_lsn)
        elif any(isinstance(e, AttemptCancelled) for e in done.events):
            log.info("attempt.cancelled", lsn=done.lsn, step_id=event.step_id, attempt=event.attempt)
        return done.state

    async def _fail(self, state: RunState, action: plan.Dispatch, kind: str, message: str, retryable: bool,
                    usage: Usage) -> RunState:
        event = AttemptFailed(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                              error_kind=kind, message=message[:2000], retryable=retryable, usage=usage,
                              at_ms=now_ms())
        fut = await self.send(state, [event])
        state = await self._outcome(state, fut, event)
        log.info("attempt.failed", lsn=state.head_lsn, error_kind=kind, reason=message[:200], retryable=retryable)
        return state


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
