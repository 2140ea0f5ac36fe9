"""Plain (tool and model) steps: one round trip per step where the next action is known.

An attempt's intent (``attempt_dispatched``, with a model step's prompt ref and partition) is
durable before its side effect (the tool run or the model call) and its outcome after. When the
outcome makes the next action a known plain attempt (the next step, or a retry of this one), that
intent rides the outcome's commit — ``[attempt_succeeded N, attempt_dispatched N+1]`` — and the
next body runs as soon as it is acked: **one acked commit per step**, written before the next
step's body runs; never two steps' outcomes in one commit. The claim (``run_started``) carries the
first attempt's intent the same way (:meth:`PlainSteps.claim`); only an attempt after an agent
step, or one planned after the run moved, pays a commit of its own for its intent.

The commit is fenced on the head both were planned on (:func:`outcome_then`). On any other head
(a cancel, a rewind or recovery committed while the side effect ran) only the outcome is recorded
(unless the attempt was resolved meanwhile) and the driver plans again.

Messages of one round trip, each only when needed, all pipelined on one connection before the
commit (so the server stores them first):

* the **commit** (always);
* the **recovery marker** of a success (outcomes KV, ``<run>.<branch>.<step>.<attempt>``), for
  a side effect whose output cannot be had again for free — a model call, a ``command`` tool;
  a ``recorded``/``scripted`` tool step has none (its output is in the workflow);
* the **output blob** and the next attempt's **prompt blob**, only when larger than the inline
  threshold (``REEL_INLINE_MAX_BYTES``, 2 KiB): a smaller body rides in its ref.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import structlog

from reel.shared.application import codeid
from reel.shared.application.fenced import Committed, Decide, Decided
from reel.shared.core.agent.turncontext import model_turn
from reel.shared.core.chat.messages import ChatRequest
from reel.shared.core.decision import Decision, Skip
from reel.shared.core.errors import ModelError, ToolError
from reel.shared.core.run import budget, codeids, timers
from reel.shared.core.run import planning as plan
from reel.shared.core.run.crashpoints import commit_points, point_name
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptEnd,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    CodeIdentity,
    Commit,
    RunSleeping,
    RunStarted,
    RunWoke,
    StepHalted,
    Usage,
)
from reel.shared.core.run.fold import apply_commit
from reel.shared.core.run.ids import CommitId
from reel.shared.core.run.state import RESUME_AFTER, RunState, RunStatus
from reel.shared.core.workflow.prices import price_for, priced
from reel.shared.core.workflow.spec import ModelStep, ToolStep, WorkflowSpec
from reel.shared.core.workflow.toolspec import output_limit
from reel.shared.nats.blobstore import is_inline, ref_for
from reel.shared.nats.control import Interrupt
from reel.shared.proc.tools import CallId, ToolOutput, run_tool
from reel.shared.runtime.clock import now_ms

from . import modelout
from .attempts import Attempts, record_outcome
from .interrupts import Interrupted, RunLost, guarded, lost

log = structlog.get_logger("reel.executor")


@dataclass(frozen=True)
class Prepared:
    """A planned plain attempt with its intent event, ready to commit (alone, or riding an outcome)."""

    action: plan.Dispatch
    step: ModelStep | ToolStep
    intent: AttemptDispatched
    request: ChatRequest | None = None  # a model step's: the first turn of an agent without tools
    prompt: bytes = b""  # its body, the exact wire request (stored unless inline)
    prompt_tokens: int = 0


@dataclass(frozen=True)
class Chained:
    """The state after an outcome commit that also carried ``next``'s intent: its body runs next."""

    state: RunState
    next: Prepared




def outcome_then(event: AttemptEnd, head_lsn: int, nxt: Prepared | None) -> Decide:
    """The outcome, and the next intent if it was planned on this head (``head_lsn``); on any other
    head the outcome alone, unless the attempt was resolved meanwhile (:func:`record_outcome`)."""
    alone = record_outcome(event)

    def decide(state: RunState) -> Decision:
        if nxt is not None and state.head_lsn == head_lsn:
            return (event, nxt.intent)
        return alone(state)
    return decide


def resume_then(event: AttemptFailed, now: int) -> Decide:
    """``event`` (a ``resume_after`` outcome) with its timer (``run_sleeping``, and ``run_woke`` if the time is
    ``now`` or past: epoch ms) while the run is driven on that branch; else the outcome alone."""
    alone = record_outcome(event)
    wake = event.resume_at_ms if isinstance(event.resume_at_ms, int) else event.at_ms

    def decide(state: RunState) -> Decision:
        if state.status != RunStatus.RUNNING or state.active_branch != event.branch_id:
            return alone(state)
        out = alone(state)
        if isinstance(out, Skip):
            return out
        timer: list[AnyEvent] = [RunSleeping(branch_id=event.branch_id, step_id=event.step_id, wake_ms=wake,
                                             reason="resume_after", at_ms=event.at_ms)]
        if wake <= now:
            timer.append(RunWoke(branch_id=event.branch_id, step_id=event.step_id, at_ms=now))
        return (*out, *timer)
    return decide


def _resume_after(action: plan.Dispatch, stdout: bytes, usage: Usage) -> AttemptFailed | None:
    """The ``resume_after`` outcome when a command's whole stdout asks to be run again later
    (``{"reel": {"resume_after_s": N, "reason": "…"}}``: :func:`reel.shared.core.run.timers.resume_request`);
    a malformed ask fails the attempt for good, saying why; ``None``: an ordinary output."""
    b, s, n = action.branch_id, action.step_id, action.attempt
    try:
        asked = timers.resume_request(stdout.decode("utf-8", errors="replace"))
    except ValueError as exc:
        return AttemptFailed(branch_id=b, step_id=s, attempt=n, error_kind="invalid_resume", message=str(exc),
                             retryable=False, usage=usage, at_ms=now_ms())
    if asked is None:
        return None
    seconds, reason = asked
    at = now_ms()
    return AttemptFailed(branch_id=b, step_id=s, attempt=n, error_kind=RESUME_AFTER,
                         message=timers.resume_message(seconds, reason), retryable=True, usage=usage, at_ms=at,
                         resume_at_ms=at + round(seconds * 1000))


def needs_marker(step: ModelStep | ToolStep) -> bool:
    """True when a success's output must be kept for recovery (a model call, a command tool)."""
    return isinstance(step, ModelStep) or step.tool.type == "command"


class PlainSteps:
    """Runs plain attempts for one executor (see module doc).

    Args:
        attempts: the executor's commits, outputs, markers and blob rewrites.
        inline_max: bodies of at most this many bytes ride in their refs.
        stopping: while set, no next intent is chained (the run is handed back between steps).
    """

    def __init__(self, attempts: Attempts, *, inline_max: int, stopping: asyncio.Event | None = None) -> None:
        self.a, self.inline_max, self.stopping = attempts, inline_max, stopping
        self.waits = modelout.RetryWaits()  # a failed model call's Retry-After or backoff, waited before the retry

    async def prepare(self, state: RunState, spec: WorkflowSpec, action: plan.Dispatch) -> Prepared:
        """The intent of ``action`` on ``state`` (a model step's context packed and its request made, as an agent's
        first turn without tools: :func:`~reel.shared.core.agent.turncontext.model_turn`)."""
        step = spec.steps[state.step_index(action.step_id)]  # O(1): the run declared the workflow's steps in order
        assert isinstance(step, ModelStep | ToolStep) and step.id == action.step_id, action
        a = self.a
        if isinstance(step, ToolStep):
            return Prepared(action=action, step=step, intent=AttemptDispatched(
                branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                executor_id=a.executor_id, at_ms=now_ms(), code=codeid.tool_step_identity(step.id, step.tool)))
        policy = plan.policy_for(step, spec)
        outputs = await a.outputs(state, action.branch_id, plan.needed_outputs(step, spec),
                                  max_bytes=plan.read_bound(policy))
        turn = model_turn(step, spec, run_id=state.run_id, attempt=action.attempt, outputs=outputs, facts=a.facts,
                          trimmed=outputs.trimmed)
        if outputs.trimmed:
            log.info("context.trimmed", step_id=step.id, outputs=outputs.trimmed, read_bound=plan.read_bound(policy))
        request, body = modelout.request_body(turn.request)
        intent = AttemptDispatched(
            branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt, executor_id=a.executor_id,
            at_ms=now_ms(), prompt_ref=ref_for(body, modelout.JSON, inline_max=self.inline_max),
            context=turn.packed.partition, code=codeid.model_identity(step.model),
        )
        step = msgspec.structs.replace(step, model=priced(step.model, spec.price_table))  # what its calls cost
        return Prepared(action=action, step=step, intent=intent, request=request, prompt=body,
                        prompt_tokens=turn.packed.packed_tokens)

    async def run(self, state: RunState, spec: WorkflowSpec, action: plan.Dispatch, cursor: plan.Cursor,
                  prepared: Prepared | None = None, interrupt: Interrupt | None = None,
                  ) -> RunState | Decided | Chained:
        """Perform one plain attempt; ``prepared``: its intent is committed already (it rode the last outcome);
        ``cursor``: the drive's planning cursor (the next action is planned from it); ``interrupt``: when it
        fires (a cancel, the drain deadline) the side effect is stopped and the attempt recorded at once
        (services/executor/interrupts.py).

        Returns the state after its outcome (:class:`Chained` if the next intent rode along), or
        a Decided that committed nothing if its own intent lost the fence (nothing was run).

        Raises:
            RunLost: the run was taken over while the side effect ran (it was stopped; nothing was written).
            ConcurrencyConflict: an outcome lost the fence on every try of the one retry policy.
        """
        if prepared is None:
            if await self.waits.wait(action.branch_id, action.step_id, action.attempt, self.stopping, interrupt):
                return state  # stopping, or a cancel: the driver plans again
            adopted = await self.adopted(state, spec, action)
            if adopted is not None:
                recorded = await self.a.commit(state, record_outcome(adopted))
                if isinstance(recorded, Committed):
                    log.info("attempt.adopted", lsn=recorded.state.head_lsn, step_id=adopted.step_id,
                             attempt=adopted.attempt, output_bytes=adopted.output_ref.size_bytes)
                    return recorded.state
                return recorded
            p = await self.prepare(state, spec, action)
            halt = halt_of(state, p, spec.code_change_policy)
            if halt is not None:  # a budget exceeded, or changed code (fail): the step fails before its call
                return await self.a.intent(state, [halt])
            done = await self._commit_intent(state, p)
            if not isinstance(done, RunState):
                return done
            state = done
        else:
            p = prepared
        self.a.crash_if(point_name(action.step_id, action.attempt, "after_intent"))
        kind = {"tool": p.step.tool.type} if isinstance(p.step, ToolStep) else {"prompt_tokens": p.prompt_tokens}
        log.debug("attempt.dispatched", lsn=state.head_lsn, chained=prepared is not None, **kind)
        has_workspace = isinstance(state.workspace, BlobRef)  # unset: the run has none (no attempt records one)
        folder = await self.a.workspaces.prepare(state, action.branch_id) \
            if has_workspace and isinstance(p.step, ToolStep) else None
        event, body = await self._side_effect(state, p, interrupt, folder)
        if lost(interrupt):  # taken over while the side effect ran: nothing of it is written (not even a snapshot)
            raise RunLost(state)
        if isinstance(p.step, ToolStep):
            event, body = await self._snapshotted(state, spec, event, body)
        self.a.crash_if(point_name(action.step_id, action.attempt, "after_run"))
        if isinstance(event, AttemptFailed) and event.error_kind == RESUME_AFTER:
            return await self._commit_resume(state, event)
        return await self._commit_outcome(state, p, event, body, await self._next(state, spec, event, cursor))

    async def _commit_resume(self, state: RunState, event: AttemptFailed) -> RunState | Decided:
        """The tool asked to be run again later: its ``resume_after`` outcome and the timer in one commit (with
        ``run_woke`` when that time has passed already) — the run sleeps; on any other head (a cancel, a rewind)
        the outcome alone, as any outcome (:func:`record_outcome`)."""
        done = await self.a.commit(state, resume_then(event, now_ms()))
        if isinstance(done, Decided):
            log.info("attempt.outcome_already_recorded", lsn=done.state.head_lsn)
            return done
        log.info("attempt.resume_after", lsn=done.state.head_lsn, resume_at_ms=event.resume_at_ms,
                 reason=event.message[:200], sleeping=done.state.status == "sleeping")
        return done.state

    async def adopted(self, state: RunState, spec: WorkflowSpec, action: plan.Dispatch) -> AttemptSucceeded | None:
        """The success of the orphan ``action`` supersedes, for a command tool not declared ``retry_safe``
        whose dead executor stored the output (its recovery marker: the side effect happened, only the outcome
        commit was lost): ``recovered``, so the tool is not run a second time. ``None`` when there is no
        orphan, no marker, or the step may be repeated (a model call, a retry-safe tool: it runs again, as an
        agent's retry-safe call does, and recovery resolves the orphan from its marker)."""
        if action.supersedes is None:
            return None
        step = spec.steps[state.step_index(action.step_id)]
        assert isinstance(step, ModelStep | ToolStep), action
        if not isinstance(step, ToolStep) or step.tool.type != "command" or step.tool.retry_safe:
            return None
        ref = await self.a.marker(state.run_id, action.branch_id, action.step_id, action.supersedes)
        if ref is None:
            return None
        return AttemptSucceeded.from_marker(action.branch_id, action.step_id, action.supersedes, ref, now_ms())

    async def claim(self, state: RunState, spec: WorkflowSpec, cursor: plan.Cursor) -> RunState | Decided | Chained:
        """Commit ``run_started`` for this executor, with the first attempt's intent when that is a plain
        attempt (one commit: :class:`Chained`); a Decided (nothing committed) if the run moved meanwhile."""
        started = RunStarted(executor_id=self.a.executor_id, at_ms=now_ms())
        nxt = await self._next(state, spec, started, cursor)
        if nxt is None:
            return await self.a.intent(state, [started])
        done = await self._commit_intent(state, nxt, before=(started,))
        return Chained(done, nxt) if isinstance(done, RunState) else done

    async def _commit_intent(self, state: RunState, p: Prepared, before: Sequence[AnyEvent] = (),
                             ) -> RunState | Decided:
        """The intent (after ``before``, planned on the same head), in one round trip with its prompt blob
        (unless inline); the side effect follows only once both are acked, so it never follows an intent
        whose prompt is missing (a prompt the store refused fails the attempt, retryable)."""
        ref = p.intent.prompt_ref
        events = [*before, p.intent]
        self.a.crash_if(*commit_points(events).before_intent)
        blob = None if ref is None or is_inline(ref) else await self.a.blobs.put_async(p.prompt)
        sent = await self.a.send(state, events)
        stored = (await asyncio.gather(blob, return_exceptions=True))[0] if blob is not None else None
        done = await self.a.intent(state, events, sent=sent)
        if isinstance(done, Decided) or not isinstance(stored, BaseException):
            return done
        event = AttemptFailed(branch_id=p.action.branch_id, step_id=p.action.step_id, attempt=p.action.attempt,
                              error_kind="prompt_store_failed", message=str(stored)[:modelout.MAX_ERROR_CHARS],
                              retryable=True, usage=Usage(), at_ms=now_ms())
        failed = await self._commit_outcome(done, p, event, None, None)
        return failed if isinstance(failed, RunState) else failed.state

    async def _snapshotted(self, state: RunState, spec: WorkflowSpec, event: AttemptEnd, body: bytes | None,
                           ) -> tuple[AttemptEnd, bytes | None]:
        """A tool step's outcome with the snapshot of its branch's working copy, as an agent's tool call's
        (:meth:`Attempts.snapshot`): ``workspace`` set when the files changed; a workspace grown past its limits
        fails the attempt (``workspace_too_large``)."""
        changed, too_large = await self.a.snapshot(state, event.branch_id, spec.workspace)
        if too_large is not None:
            return modelout.tool_failure((event.branch_id, event.step_id, event.attempt), too_large,
                                         event.usage.latency_ms), None
        return msgspec.structs.replace(event, workspace=changed), body

    async def _side_effect(self, state: RunState, p: Prepared, interrupt: Interrupt | None, folder: Path | None,
                           ) -> tuple[AttemptEnd, bytes | None]:
        """Run the tool or call the model (stopped if ``interrupt`` fires: a command's process group is
        killed, a model's request aborted; recorded and scripted ones are instant); a command runs with
        ``$REEL_WORKSPACE`` the branch's working copy ``folder`` when the run has a workspace: the outcome event,
        and a success's output body (``None`` for a tool output too large to hold: stored already, streamed;
        one the store refused fails the attempt ``output_store_failed``, retryable)."""
        action, step = p.action, p.step
        started = time.perf_counter()
        try:
            if isinstance(step, ToolStep):
                stdin = self.a.stdin_of(state, action.branch_id, step.tool.stdin_from) if step.tool.stdin_from else None
                call = CallId(state.run_id, action.branch_id, step.id, action.attempt, tool=step.tool.name)
                spool = await guarded(run_tool(step.tool, call, stdin=stdin,
                                               limit=output_limit(step.tool, self.a.tool_output), workspace=folder),
                                      interrupt if step.tool.type == "command" else None)
                usage = Usage(latency_ms=_ms_since(started))
                if step.tool.type == "command" and spool.size_bytes < 4096 and not spool.truncated:
                    with spool:
                        text = spool.read()
                    asked = _resume_after(action, text, usage)
                    if asked is not None:
                        return asked, None
                    spool = ToolOutput.of(text)
                ref, body = await self.a.tool_body(spool, self.inline_max)  # a large one is stored now, streamed
                return AttemptSucceeded(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                        output_ref=ref, usage=usage, at_ms=now_ms(),
                                        truncated=True if spool.truncated else msgspec.UNSET), body
            else:
                assert p.request is not None, p
                request = p.request
                instant = step.model.adapter in ("replay", "scripted")
                out = self.a.stream_out(state.run_id, action.branch_id, action.step_id, action.attempt,
                                        step.model.streams)
                resp = await guarded(modelout.ask(step.model, request, self.a.counter, out),
                                     None if instant else interrupt)
                usage = modelout.answer_usage(resp.input_tokens, resp.output_tokens, _ms_since(started),
                                              resp.cost_usd, resp.usage_source)
        except (ToolError, ModelError, Interrupted) as exc:
            where = (action.branch_id, action.step_id, action.attempt)
            if isinstance(p.step, ModelStep) and isinstance(exc, ModelError | Interrupted):
                failed, error_body = modelout.failure(where, exc, modelout.failure_usage(exc, _ms_since(started)),
                                                      inline_max=self.inline_max)
                self.waits.failed(failed, exc, p.step.model.adapter)
                return failed, error_body
            assert not isinstance(exc, ModelError), exc
            return modelout.tool_failure(where, exc, _ms_since(started)), None
        body = resp.text.encode()
        event, ref = modelout.answer_outcome((action.branch_id, action.step_id, action.attempt), body=body,
                                             media_type="text/plain", finish_reason=resp.finish_reason, usage=usage,
                                             policy=step.truncation_policy, inline_max=self.inline_max)
        self.a.bodies.keep(body, ref)
        return event, body

    async def _next(self, state: RunState, spec: WorkflowSpec, event: AttemptEnd | RunStarted,
                    cursor: plan.Cursor) -> Prepared | None:
        """The next attempt's intent if, with ``event`` applied, the next action is a plain attempt (pure
        planning on a preview of the state; nothing is chained while the executor is stopping)."""
        if self.stopping is not None and self.stopping.is_set():
            return None
        preview = apply_commit(state, state.head_lsn + 1, Commit(
            commit_id=CommitId("preview"), run_id=state.run_id, writer=self.a.executor_id, events=(event,)))
        action = plan.next_action(preview, self.a.executor_id, start=cursor.peek(preview))
        if not isinstance(action, plan.Dispatch) or action.supersedes is not None:
            return None  # an orphan's successor is never chained: its marker is read first (run)
        if self.waits.pending(action.branch_id, action.step_id):
            return None  # a retry that must wait: its intent is committed once the wait is over (run)
        nxt = await self.prepare(preview, spec, action)
        halted = halt_of(preview, nxt, spec.code_change_policy) is not None
        return None if halted else nxt  # a halt is committed by run(), alone

    async def _commit_outcome(self, state: RunState, p: Prepared, event: AttemptEnd, body: bytes | None,
                              nxt: Prepared | None) -> RunState | Chained:
        """One round trip (:meth:`Attempts.send_with`): the output blob, the marker, the next prompt blob
        (each if needed), then the commit of the outcome (and ``nxt``'s intent). A blob refused while the
        commit lands is written again (its ref is content-addressed) before the run moves on; a lost
        marker only matters if the commit is lost too."""
        a = self.a
        bodies: list[tuple[bytes, str]] = []
        if isinstance(event, AttemptSucceeded) and body is not None and not is_inline(event.output_ref):
            bodies.append((body, event.output_ref.media_type))
        if isinstance(event, AttemptFailed) and body is not None and isinstance(event.error_ref, BlobRef) \
                and not is_inline(event.error_ref):  # the whole error body (a server's error, a cut answer)
            bodies.append((body, event.error_ref.media_type))
        nref = nxt.intent.prompt_ref if nxt is not None else None
        if nxt is not None and nref is not None and not is_inline(nref):
            bodies.append((nxt.prompt, nref.media_type))
        marks = [event] if isinstance(event, AttemptSucceeded) and needs_marker(p.step) else []
        head = state.head_lsn
        events: list[AnyEvent] = [event, nxt.intent] if nxt is not None else [event]
        points = commit_points(events)  # fault injection, as for every commit (shared/core/run/crashpoints.py)
        a.crash_if(*points.before_intent)
        sent = await a.send_with(state, events, bodies, marks, crash_point=points.after_output)
        done = await a.commit(state, outcome_then(event, head, nxt), sent=sent)
        if isinstance(done, Committed):
            a.crash_if(*commit_points(done.events).after_commit)
        if isinstance(done, Decided):
            log.info("attempt.outcome_already_recorded", lsn=done.state.head_lsn)
        elif any(isinstance(e, AttemptCancelled) for e in done.events):
            log.info("attempt.cancelled", lsn=done.lsn, step_id=event.step_id, attempt=event.attempt)
            return done.state
        if isinstance(event, AttemptSucceeded):
            log.info("attempt.succeeded", lsn=done.state.head_lsn, output_bytes=event.output_ref.size_bytes,
                     input_tokens=event.usage.input_tokens, output_tokens=event.usage.output_tokens,
                     latency_ms=round(event.usage.latency_ms, 3))
        else:
            log.info("attempt.failed", lsn=done.state.head_lsn, error_kind=event.error_kind,
                     reason=event.message[:200], retryable=event.retryable)
        if isinstance(done, Committed) and nxt is not None and len(done.events) == 2:
            return Chained(done.state, nxt)
        return done.state


def halt_of(state: RunState, p: Prepared, on_code_change: str = "continue") -> StepHalted | None:
    """The ``step_halted`` that takes the place of ``p``'s intent on ``state``: ``budget_exhausted`` when its call
    would exceed the run's budget (a model step: its prompt tokens plus its ``max_tokens``, priced; a tool step:
    one tool call); under ``on_code_change`` ``fail``, ``code_changed`` when its code differs from its tool's (or
    adapter's) earlier attempts on the branch; else ``None``."""
    at = now_ms()
    code = p.intent.code
    if on_code_change == "fail" and isinstance(code, CodeIdentity):
        change = codeids.change_before(state.branches[p.action.branch_id], p.action.step_id, p.action.attempt, code)
        if change is not None:
            log.warning("run.code_changed", step_id=change.step_id, attempt=change.attempt, kind=code.kind,
                        name=code.name, what=list(change.what))
            return codeids.halt(change, p.action.branch_id, at)
    if budget.budget_of(state.budget) is None:
        return None
    if isinstance(p.step, ModelStep):
        worst = budget.worst_case(p.prompt_tokens, p.step.model, price_for(p.step.model))
        found = budget.check(state, at, model_call=worst)
    else:
        found = budget.check(state, at, tool_calls=1)
    if found is None:
        return None
    log.info("run.budget_exhausted", step_id=p.action.step_id, budget=found.budget, limit=found.limit,
             spent=found.spent, needed=found.needed)
    return found.event(p.action.branch_id, p.action.step_id, at)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
