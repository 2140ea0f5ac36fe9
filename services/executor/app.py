"""Executor service: turns start/resume commands into runs and drives them to ``Verifying``.

Per attempt it commits the intent (``attempt_dispatched``, with the prompt blob
ref and the ContextPartition of a model step, in one commit) *before* the side
effect, and the outcome after. Every commit is fenced on the LSN the executor
last saw, so two executors can never both write a run; the loser re-reads and
yields. The command message stays un-acked (kept alive with in-progress acks)
until the run rests, so if this process dies JetStream redelivers the command
and another executor takes over from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections import OrderedDict
from typing import Any

import msgspec
import structlog
import tenacity

from shared.clock import now_ms
from shared.config import Config
from shared.core import planning as plan
from shared.core.commands import Reply, ResumeRun, StartRun, decode_command, error_reply
from shared.core.errors import (
    BlobMissing,
    ConcurrencyConflict,
    InvalidCommand,
    ModelError,
    ReelError,
    RunNotFound,
    ToolError,
    WorkflowInvalid,
)
from shared.core.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    Commit,
    RunCreated,
    RunStarted,
    RunVerifying,
    Usage,
)
from shared.core.fold import DRIVABLE, RunState, apply_commit
from shared.core.ids import ROOT_BRANCH, ExecutorId, is_token, new_commit_id, new_executor_id, run_id_for_key
from shared.core.packer import pack
from shared.core.subjects import outcome_key
from shared.core.tokens import DEFAULT_COUNTER, TokenCounter
from shared.core.workflow import ModelStep, ToolStep, WorkflowSpec, encode_workflow, parse_workflow, validate_workflow
from shared.models import ModelRequest, make_adapter
from shared.nats.blobstore import JetStreamBlobStore, ref_for
from shared.nats.consumer import Ack, Command, CommandConsumer, send_reply
from shared.nats.eventlog import JetStreamEventLog
from shared.nats.infra import Infra
from shared.nats.publish import publish_pipelined
from shared.proc.tools import reap_orphaned_tools, run_tool

log = structlog.get_logger("reel.executor")

TEXT_CACHE_BYTES = 64 * 1024 * 1024
OUTCOME_RETRIES = 20
BLOB_TIMEOUT_S = 30.0
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
CRASH_ENV = "REEL_EXECUTOR_CRASH_AT"  # fault injection for recovery tests: "<step_id>:<attempt>:after_output"


class HandedBack(Exception):
    """This executor is stopping: the run goes back to the queue (its command is nak'ed) between steps."""


class Executor:
    """One executor process: its id, the log, the blob store, and the workflows it has loaded."""

    def __init__(self, infra: Infra, cfg: Config, *, executor_id: ExecutorId | None = None,
                 counter: TokenCounter = DEFAULT_COUNTER, stopping: asyncio.Event | None = None) -> None:
        self.infra, self.cfg = infra, cfg
        self.stopping = stopping  # set on shutdown: finish the attempt in flight, then hand runs back
        self.executor_id = executor_id or new_executor_id()
        self.log = JetStreamEventLog(infra.nc, cfg.names)
        self.blobs = JetStreamBlobStore(infra.nc, infra.blobs, cfg.names.blob_bucket)
        self.counter = counter
        self.facts = plan.TextFacts(counter)
        self._specs: dict[str, WorkflowSpec] = {}
        self._texts: OrderedDict[str, str] = OrderedDict()  # sha256 → output text, LRU
        self._texts_bytes = 0
        self._driving: dict[str, bool] = {}  # run id → "look again" (a command for it came in meanwhile)
        self._crash_at = os.environ.get(CRASH_ENV, "")

    # ---- command handling ------------------------------------------------------------
    async def handle(self, cmd: Command) -> Ack:
        """Handle one start or resume command (reply, then drive the run until it rests)."""
        kind = cmd.subject.rsplit(".", 1)[-1]
        try:
            if kind == "start":
                run_id = await self._start(cmd)
            else:
                run_id = decode_command(cmd.data, ResumeRun).run_id
                if not is_token(run_id):
                    raise InvalidCommand(f"{run_id[:80]!r} is not a valid run id (at `$.run_id`)")
                if await self.log.head(run_id) is None:  # refuse before anything else; drive() loads it
                    raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
        except ReelError as exc:
            log.warning("command.rejected", command=kind, code=exc.code, reason=exc.message,
                        stream_seq=cmd.stream_seq)
            await send_reply(self.infra, cmd, error_reply(exc))
            return Ack.ACK
        if kind == "resume":
            await send_reply(self.infra, cmd, Reply(ok=True, run_id=run_id))
        if run_id in self._driving:  # this process drives it already: make that loop look once more
            self._driving[run_id] = True
            log.info("run.already_driving", command=kind)
            return Ack.ACK
        self._driving[run_id] = False
        try:
            while True:
                await self.drive(run_id)
                if not self._driving[run_id]:
                    return Ack.ACK
                self._driving[run_id] = False
        except HandedBack:
            return Ack.NAK  # redelivered at once to another instance, which takes over from the log
        finally:
            del self._driving[run_id]

    async def _start(self, cmd: Command) -> str:
        start = decode_command(cmd.data, StartRun)
        spec = await self._spec_of_command(start)
        key = start.idempotency_key or f"cmd:{cmd.identity}"  # no key: the command message is the identity
        run_id = run_id_for_key(key)
        structlog.contextvars.bind_contextvars(run_id=run_id)
        workflow_ref = await self.blobs.put(encode_workflow(spec), "application/json")
        self._specs[workflow_ref.sha256] = spec
        created = RunCreated(
            run_id=run_id, branch_id=ROOT_BRANCH, workflow_name=spec.name, workflow_ref=workflow_ref,
            steps=spec.decls(), verifiers=tuple(v.label for v in spec.verifiers),
            idempotency_key=start.idempotency_key, created_ms=now_ms(), labels={**spec.labels, **start.labels},
        )
        try:
            lsn = await self.log.commit(run_id, [created], expected_lsn=0, writer=self.executor_id)
            log.info("run.created", workflow=spec.name, steps=len(spec.steps), lsn=lsn)
            reply = Reply(ok=True, run_id=run_id, status="pending", created=True, lsn=lsn)
        except ConcurrencyConflict:
            state = await self.log.load(run_id)
            log.info("run.exists", status=state.status, idempotency_key=start.idempotency_key)
            reply = Reply(ok=True, run_id=run_id, status=state.status, created=False)  # nothing committed: lsn 0
        await send_reply(self.infra, cmd, reply)
        return run_id

    async def _spec_of_command(self, start: StartRun) -> WorkflowSpec:
        if (start.workflow is None) == (start.workflow_ref is None):
            raise InvalidCommand("start needs exactly one of `workflow` or `workflow_ref`")
        if start.workflow is not None:
            return validate_workflow(start.workflow)
        assert start.workflow_ref is not None
        return await self._spec_of_ref(start.workflow_ref)

    async def _spec_of_ref(self, ref: BlobRef) -> WorkflowSpec:
        """The workflow a start command sends by reference; errors name `$.workflow_ref`.

        Raises:
            InvalidCommand: ``sha256`` is not a sha256 hex digest.
            BlobMissing: the blob store has no such (intact) blob.
            WorkflowInvalid: the blob is not a valid workflow.
        """
        if not _SHA256_HEX.fullmatch(ref.sha256):
            raise InvalidCommand(f"workflow_ref.sha256 must be 64 lowercase hex digits, got {ref.sha256[:80]!r}"
                                 " (at `$.workflow_ref.sha256`)")
        try:
            return await self._load_spec(ref)
        except BlobMissing as exc:
            raise BlobMissing(f"workflow_ref: {exc.message}; upload the workflow first (at `$.workflow_ref`)") from exc

    async def _load_spec(self, ref: BlobRef) -> WorkflowSpec:
        spec = self._specs.get(ref.sha256)
        if spec is None:
            try:
                spec = parse_workflow(await self.blobs.get(ref), fmt="json")
            except WorkflowInvalid as exc:
                raise WorkflowInvalid(f"workflow blob {ref.sha256[:12]}…: {exc.message}") from exc
            self._specs[ref.sha256] = spec
        return spec

    # ---- driving a run ------------------------------------------------------------------
    async def drive(self, run_id: str) -> RunState | None:
        """Drive ``run_id`` until it rests (Verifying, Completed, Cancelled) or another executor owns it."""
        structlog.contextvars.bind_contextvars(run_id=run_id)
        try:
            state = await self.log.load(run_id)
        except RunNotFound:
            log.warning("run.not_found")
            return None
        spec = await self._load_spec(state.workflow_ref)
        claimed = False
        while True:
            try:
                action = plan.next_action(state, self.executor_id)
                if isinstance(action, plan.Rest):
                    log.info("run.resting", status=action.status, lsn=state.head_lsn)
                    return state
                if self.stopping is not None and self.stopping.is_set():
                    log.info("run.handed_back", lsn=state.head_lsn, reason="executor stopping")
                    raise HandedBack(state.run_id)
                if isinstance(action, plan.Claim):
                    if claimed:  # we held it and another executor took it over: never take it back
                        log.info("run.yielded", owner=state.executor_id)
                        return state
                    claimed = True
                state = await self._perform(state, spec, action)
            except ConcurrencyConflict:
                state = await self.log.load(run_id)
                if state.executor_id not in (None, self.executor_id) and state.status in DRIVABLE:
                    log.info("run.yielded", owner=state.executor_id)
                    return state

    async def _commit(self, state: RunState, events: list[AnyEvent]) -> RunState:
        fut = await self.log.commit_async(state.run_id, events, expected_lsn=state.head_lsn, writer=self.executor_id)
        return await self._applied(state, fut, events)

    async def _applied(self, state: RunState, fut: asyncio.Future[int], events: list[AnyEvent]) -> RunState:
        lsn = await fut
        return apply_commit(state, lsn, Commit(commit_id="", run_id=state.run_id, events=tuple(events)))

    async def _perform(self, state: RunState, spec: WorkflowSpec, action: plan.Action) -> RunState:
        if isinstance(action, plan.Claim):
            state = await self._commit(state, [RunStarted(executor_id=self.executor_id, at_ms=now_ms())])
            log.info("run.claimed", executor_id=self.executor_id, lsn=state.head_lsn)
            return state
        if isinstance(action, plan.EnterVerifying):
            cid = new_commit_id()
            events: list[AnyEvent] = [RunVerifying(branch_id=action.branch_id, at_ms=now_ms())]
            fut = await self.log.commit_async(state.run_id, events, expected_lsn=state.head_lsn,
                                              writer=self.executor_id, commit_id=cid)
            state = await self._applied(state, fut, events)
            log.info("run.verifying", branch_id=action.branch_id, lsn=state.head_lsn)
            await self._snapshot(state, cid)
            return state
        assert isinstance(action, plan.Dispatch)
        step = spec.step(action.step_id)
        structlog.contextvars.bind_contextvars(step_id=action.step_id, attempt=action.attempt,
                                               branch_id=action.branch_id)
        try:
            if isinstance(step, ModelStep):
                return await self._model_attempt(state, spec, step, action)
            return await self._tool_attempt(state, step, action)
        finally:
            structlog.contextvars.unbind_contextvars("step_id", "attempt", "branch_id")

    def _remember_text(self, sha: str, text: str) -> None:
        if sha in self._texts:
            self._texts.move_to_end(sha)
            return
        self._texts[sha] = text
        self._texts_bytes += len(text)
        while self._texts_bytes > TEXT_CACHE_BYTES and len(self._texts) > 1:
            _, old = self._texts.popitem(last=False)
            self._texts_bytes -= len(old)

    async def _snapshot(self, state: RunState, commit_id: str) -> None:
        """Snapshot the state every verifier of this run pins (best effort: readers fall back to the log)."""
        try:
            store = await self.log.snapshots()
            if store is not None:
                await store.save(state, commit_id)
        except Exception as exc:  # a snapshot is only a shortcut; the run is already safely in Verifying
            log.warning("run.snapshot_failed", lsn=state.head_lsn, error=str(exc))

    async def _outputs(self, state: RunState, branch_id: str, step_ids: list[str]) -> dict[str, str]:
        """Output texts of earlier steps (from this executor's LRU, else the blob store)."""
        out: dict[str, str] = {}
        for sid in step_ids:
            ref = plan.succeeded_output(state, branch_id, sid)
            if ref is None:
                continue
            text = self._texts.get(ref.sha256)
            if text is None:
                text = await self.blobs.get_text(ref)
            self._remember_text(ref.sha256, text)
            out[sid] = text
        return out

    async def _model_attempt(self, state: RunState, spec: WorkflowSpec, step: ModelStep,
                             action: plan.Dispatch) -> RunState:
        outputs = await self._outputs(state, action.branch_id, plan.needed_outputs(step, spec))
        items = plan.context_items(step, spec, outputs)
        packed = pack(plan.candidates(items, self.facts), plan.policy_for(step, spec))
        prompt = plan.render_prompt(step, items, packed.partition.packed)
        body = prompt.encode()
        prompt_ref = ref_for(body)
        intent = AttemptDispatched(
            branch_id=action.branch_id, step_id=step.id, attempt=action.attempt, executor_id=self.executor_id,
            at_ms=now_ms(), prompt_ref=prompt_ref, context=packed.partition,
        )
        # the prompt blob and the intent go out in one round trip (the ref is computed locally); the model
        # is called only once both are acked, so no side effect ever follows an intent whose prompt is missing
        prompt_fut = await self.blobs.put_async(body)
        intent_fut = await self.log.commit_async(state.run_id, [intent], expected_lsn=state.head_lsn,
                                                 writer=self.executor_id)
        blob_result, = await asyncio.gather(prompt_fut, return_exceptions=True)
        state = await self._applied(state, intent_fut, [intent])
        if isinstance(blob_result, BaseException):
            return await self._fail(state, action, "prompt_store_failed", str(blob_result), True, Usage())
        p = packed.partition
        log.info("attempt.dispatched", lsn=state.head_lsn, packed=len(p.packed), available=len(p.available),
                 dropped=len(p.dropped), prompt_tokens=packed.packed_tokens)
        started = time.perf_counter()
        try:
            adapter = make_adapter(step.model, self.counter)
            resp = await adapter.complete(ModelRequest(run_id=state.run_id, step_id=step.id, attempt=action.attempt,
                                                       prompt=prompt, prompt_tokens=packed.packed_tokens))
        except ModelError as exc:
            usage = Usage(input_tokens=packed.packed_tokens, latency_ms=_ms_since(started), cost_usd=exc.cost_usd)
            return await self._fail(state, action, exc.kind, exc.message, exc.retryable, usage)
        usage = Usage(input_tokens=resp.input_tokens, output_tokens=resp.output_tokens,
                      latency_ms=_ms_since(started), cost_usd=resp.cost_usd)
        return await self._succeed(state, action, resp.text, usage)

    async def _tool_attempt(self, state: RunState, step: ToolStep, action: plan.Dispatch) -> RunState:
        intent = AttemptDispatched(branch_id=action.branch_id, step_id=step.id, attempt=action.attempt,
                                   executor_id=self.executor_id, at_ms=now_ms())
        state = await self._commit(state, [intent])
        log.info("attempt.dispatched", lsn=state.head_lsn, tool=step.tool.type)
        stdin = None
        if step.tool.stdin_from:
            stdin = (await self._outputs(state, action.branch_id, [step.tool.stdin_from])).get(
                step.tool.stdin_from, "").encode()
        started = time.perf_counter()
        try:
            text = await run_tool(step.tool, attempt=action.attempt, stdin=stdin, env={
                "REEL_RUN_ID": state.run_id, "REEL_BRANCH_ID": action.branch_id, "REEL_STEP_ID": step.id,
                "REEL_ATTEMPT": str(action.attempt)})
        except ToolError as exc:
            return await self._fail(state, action, exc.kind, exc.message, exc.retryable,
                                    Usage(latency_ms=_ms_since(started)))
        return await self._succeed(state, action, text, Usage(latency_ms=_ms_since(started)))

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
        marker_fut = publish_pipelined(self.infra.nc, self.cfg.names.outcome_marker(key),
                                       msgspec.json.encode(ref), None, BLOB_TIMEOUT_S)
        if self._crash_at == f"{action.step_id}:{action.attempt}:after_output":
            await asyncio.gather(blob_fut, marker_fut)
            log.error("executor.crash_injected", point=self._crash_at)
            os._exit(137)
        event = AttemptSucceeded(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                 output_ref=ref, usage=usage, at_ms=now_ms())
        fut = await self.log.commit_async(state.run_id, [event], expected_lsn=state.head_lsn,
                                          writer=self.executor_id)
        stored = await asyncio.gather(blob_fut, marker_fut, return_exceptions=True)
        if isinstance(stored[0], BaseException):
            log.warning("attempt.output_rewrite", error=str(stored[0]))
            await self._store_until_done(body)
        if isinstance(stored[1], BaseException):  # the marker only matters if the commit is lost too
            log.warning("attempt.marker_failed", error=str(stored[1]))
        state = await self._outcome(state, fut, event)
        log.info("attempt.succeeded", lsn=state.head_lsn, output_bytes=len(body),
                 input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                 latency_ms=round(usage.latency_ms, 3))
        return state

    async def _store_until_done(self, body: bytes) -> None:
        """Write a blob whose ref is (about to be) committed, retrying with backoff until it is stored."""
        async for attempt in tenacity.AsyncRetrying(wait=tenacity.wait_exponential(max=10), reraise=True,
                                                    stop=tenacity.stop_after_delay(600)):
            with attempt:
                await self.blobs.put(body)

    async def _outcome(self, state: RunState, fut: asyncio.Future[int],
                       event: AttemptSucceeded | AttemptFailed) -> RunState:
        """Settle an outcome commit. If someone else committed while the side effect ran (a cancel,
        a rewind, recovery), the outcome is still a fact about this attempt: record it on top of
        their commit, unless the attempt was resolved meanwhile. Never drops an outcome silently.
        """
        try:
            return await self._applied(state, fut, [event])
        except ConcurrencyConflict:
            pass
        for _ in range(OUTCOME_RETRIES):
            state = await self.log.load(state.run_id)
            attempt = next((a for a in state.branches[event.branch_id].attempts.get(event.step_id, [])
                            if a.attempt == event.attempt), None)
            if attempt is None or attempt.status != "dispatched":
                log.info("attempt.outcome_already_recorded", lsn=state.head_lsn)
                return state
            try:
                return await self._commit(state, [event])
            except ConcurrencyConflict:
                continue
        raise ConcurrencyConflict(f"could not record the outcome of {event.step_id}#{event.attempt}",
                                  run_id=state.run_id)

    async def _fail(self, state: RunState, action: plan.Dispatch, kind: str, message: str, retryable: bool,
                    usage: Usage) -> RunState:
        event = AttemptFailed(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                              error_kind=kind, message=message[:2000], retryable=retryable, usage=usage,
                              at_ms=now_ms())
        fut = await self.log.commit_async(state.run_id, [event], expected_lsn=state.head_lsn,
                                          writer=self.executor_id)
        state = await self._outcome(state, fut, event)
        log.info("attempt.failed", lsn=state.head_lsn, error_kind=kind, reason=message[:200], retryable=retryable)
        return state


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


async def heartbeat(infra: Infra, executor_id: str, ttl_s: int, stop: asyncio.Event) -> None:
    """Keep this executor's lease alive (KV entry, bucket max age = TTL) until ``stop``."""
    body = json.dumps({"executor_id": executor_id, "pid": os.getpid()}).encode()
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await infra.leases.put(executor_id, body)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ttl_s / 3)
    with contextlib.suppress(Exception):
        await infra.leases.delete(executor_id)


async def serve(infra: Infra, cfg: Config, stop: asyncio.Event, **kwargs: Any) -> None:
    """Run one executor instance until ``stop`` is set."""
    ex = Executor(infra, cfg, stopping=stop, **kwargs)
    structlog.contextvars.bind_contextvars(executor_id=ex.executor_id)
    reaped = await asyncio.to_thread(reap_orphaned_tools)
    if reaped:
        log.warning("executor.reaped_orphaned_tools", process_groups=reaped)
    names = cfg.names
    consumer = CommandConsumer(infra, cfg, "executor", [names.command("start"), names.command("resume")],
                               ex.handle, concurrency=cfg.max_concurrent_runs, ack_wait_s=cfg.command_ack_wait_s)
    lease_stop = asyncio.Event()  # the lease outlives the drain: in-flight attempts are still ours
    hb = asyncio.create_task(heartbeat(infra, ex.executor_id, cfg.lease_ttl_s, lease_stop))
    try:
        await consumer.run(stop)
    finally:
        lease_stop.set()
        await hb
