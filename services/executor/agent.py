"""Agent steps in the executor: the actions of :mod:`reel.shared.core.agent.actions`, performed for real.

One :class:`AgentRun` per drive of a run holds the attempts it has in flight —
model calls of turns and tool calls, as asyncio tasks that only perform the side
effect (services/executor/agenttools.py, the chat model of the step) and never
commit. The driver (services/executor/driver.py) asks ``next_action`` with their
keys; on ``Wait`` it hands control here to record what finished. Structured: the
tasks live inside the ``async with`` of the drive, and none outlives it (they are
drained at rest and before a hand-back, cancelled if the drive fails).

Commits, each one fenced round trip with its blobs and recovery markers pipelined
on the same connection (decided by :func:`~reel.services.executor.agentio.planned_or_facts`). A body of at
most ``REEL_INLINE_MAX_BYTES`` (a prompt, an answer, a result, an error body) rides inline in its ref instead of
being stored, as a plain step's does (:func:`~reel.shared.nats.blobstore.ref_for`):

==============================  ===================================================================
when                            one commit
==============================  ===================================================================
a turn attempt starts           ``[steps_declared(turn)?, attempt_dispatched(prompt_ref, partition)]``
                                with the prompt blob (the exact wire request), or that inline in its ref
a turn answered                 ``[attempt_succeeded, steps_declared(calls), attempt_dispatched × ≤
                                max_parallel_tools]`` with the output blob (the exact response
                                message) and its marker — or ``[attempt_succeeded, agent_finished]``
a turn failed                   ``[attempt_failed, agent_finished?]``; the next attempt's intent waits
                                the provider's ``Retry-After``, else a full-jitter backoff
                                (:func:`~reel.services.executor.modelout.retry_delay_s`)
tool results that finished      ``[attempt_succeeded|attempt_failed …, agent_finished?]`` plus, when
together                        they complete the turn, the next turn's intent (its prompt blob
                                pipelined), or else the intents of the calls they free a slot for
orphans of a dead executor      ``attempt_failed(outcome_unknown)`` per non-retry-safe call (its result
                                when the dead executor stored its marker: ``attempt_succeeded``)
==============================  ===================================================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import msgspec
import structlog

from reel.shared.application import codeid
from reel.shared.application.fenced import Committed, Decided
from reel.shared.auth import secrets
from reel.shared.core.agent import commits as ac
from reel.shared.core.agent import turnfold
from reel.shared.core.agent.memo import ContextMemo
from reel.shared.core.errors import ModelError, ToolError
from reel.shared.core.input import requestfold
from reel.shared.core.run import budget, codeids
from reel.shared.core.run import planning as plan
from reel.shared.core.run.crashpoints import commit_points, point_name
from reel.shared.core.run.events import (
    AgentFinished,
    AnyEvent,
    AttemptDispatched,
    AttemptEnd,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    CodeIdentity,
    StepsDeclared,
    Usage,
)
from reel.shared.core.run.ids import BranchId, ExecutorId, StepId
from reel.shared.core.run.state import DRIVABLE, RunState
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.workflow.prices import price_for
from reel.shared.core.workflow.spec import WorkflowSpec
from reel.shared.nats.blobstore import is_inline, ref_for
from reel.shared.nats.control import Interrupt
from reel.shared.runtime.clock import now_ms

from . import modelout
from .agentio import (
    JSON,
    CallDone,
    Done,
    Key,
    PreparedTurn,
    TurnDone,
    call_model,
    call_tool,
    calls_of_message,
    planned_or_facts,
    prepare_turn,
)
from .agenttools import CallContext, PythonTools
from .attempts import Attempts
from .bodies import Bodies
from .interrupts import RunLost, lost

log = structlog.get_logger("reel.executor")



class AgentRun:
    """The agent attempts one drive of one run has in flight, and the commits that record them.

    Args:
        attempts: the executor's attempt machinery (log, blobs, markers, text facts).
        run_id: the run driven; spec: its workflow; python_tools: its resolved ``python:`` tools.
        bodies: the executor's blob-body cache.
        inline_max: prompts, answers, results and error bodies of at most this many bytes ride inline in their refs
            (``REEL_INLINE_MAX_BYTES``; nothing is stored for them), as a plain step's do.
        stopping: set on shutdown: no new model call or tool call starts; a Retry-After wait ends.
        interrupt: the drive's; when it fires every attempt in flight is stopped and recorded at once.
    """

    def __init__(self, attempts: Attempts, run_id: str, spec: WorkflowSpec, python_tools: PythonTools, *,
                 bodies: Bodies, stopping: asyncio.Event | None = None, interrupt: Interrupt | None = None,
                 inline_max: int = 0) -> None:
        self.attempts, self.run_id, self.spec, self.python_tools = attempts, run_id, spec, python_tools
        self.inline_max = inline_max
        self.bodies, self.stopping, self.interrupt = bodies, stopping, interrupt
        self.me = ExecutorId(attempts.executor_id)
        self.tasks: dict[Key, asyncio.Task[Done]] = {}
        self.waits = modelout.RetryWaits()  # a failed turn's Retry-After or backoff, waited before the next intent
        self.contexts = ContextMemo(attempts.facts)  # earlier turns' items, kept from turn to turn of this drive

    async def __aenter__(self) -> AgentRun:
        return self

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        pending = list(self.tasks.values())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self.tasks.clear()

    def _mcp_tool(self, step_id: str, tool_name: str | None) -> bool:
        """Whether the call ``step_id`` is of a tool an MCP server lists."""
        agent = self.spec.agent(step_id.split(":", 1)[0])
        return any(t.name == tool_name and t.type == "mcp" for t in agent.tools)

    @property
    def in_flight(self) -> frozenset[Key]:
        """``(branch, step, attempt)`` of every attempt running (or finished, not yet recorded)."""
        return frozenset(self.tasks)

    # ---- the actions ---------------------------------------------------------------------------
    async def perform(self, state: RunState, action: plan.Action) -> RunState | Decided:
        """Perform one agent action planned on ``state``; the state after it, or the Decided that committed
        nothing (the run moved)."""
        if isinstance(action, plan.Wait):
            return await self.collect(state)
        if isinstance(action, plan.DispatchTurn):
            return await self._dispatch_turn(state, action)
        if isinstance(action, plan.DispatchCalls):
            return await self._commit_starting(state, ac.call_intents(action, executor_id=self.me, at_ms=now_ms()),
                                               (), calls=action.calls, branch_id=action.branch_id)
        if isinstance(action, plan.ResolveUnknown):
            return await self.attempts.intent(state, await self._resolve_unknown(state, action))
        if isinstance(action, plan.AdoptTurn):
            body = await self.bodies.get(action.output_ref)
            out = ac.turn_outcome(state, action.branch_id, self.spec.agent(action.agent), action.turn,
                                  output_ref=action.output_ref, calls=calls_of_message(state, action, body),
                                  outcome=None, executor_id=self.me, at_ms=now_ms(), approval=self.spec.approval)
            return await self._commit_starting(state, out.events, (), calls=out.started, branch_id=action.branch_id,
                                               bodies=[(b, JSON) for b in out.blobs])
        if isinstance(action, plan.AwaitInput):  # only a human moves the run on: it rests (requestfold)
            log.info("agent.awaiting_input", agent=action.agent, requests=list(action.requests))
            return await self.attempts.intent(state, [action.event(now_ms())])
        assert isinstance(action, plan.FinishAgent), action
        log.info("agent.finished", agent=action.agent, status=action.status, error_kind=action.error_kind)
        return await self.attempts.intent(state, [action.event(now_ms())])

    async def _resolve_unknown(self, state: RunState, action: plan.ResolveUnknown) -> list[AnyEvent]:
        """``outcome_unknown`` for each orphaned non-retry-safe call — unless its dead executor stored the
        result's marker before dying: then the result is known, and recorded (``recovered``)."""
        refs = await asyncio.gather(*(self.attempts.marker(state.run_id, action.branch_id, c.step_id, c.attempt)
                                      for c in action.calls))
        known: list[AnyEvent] = [AttemptSucceeded.from_marker(action.branch_id, c.step_id, c.attempt, ref, now_ms())
                                 for c, ref in zip(action.calls, refs, strict=True) if ref is not None]
        unknown = tuple(c for c, ref in zip(action.calls, refs, strict=True) if ref is None)
        log.warning("agent.orphaned_calls", branch_id=action.branch_id, unknown=[c.step_id for c in unknown],
                    from_marker=[e.step_id for e in known if isinstance(e, AttemptSucceeded)])
        if not unknown:
            return known
        rest = msgspec.structs.replace(action, calls=unknown)
        return [*known, *ac.unknown_outcomes(state, rest, at_ms=now_ms())]

    async def drain(self, state: RunState) -> RunState:
        """Record every attempt still in flight (starting nothing new); the state after."""
        while self.tasks:
            state = await self.collect(state, more=False)
        return state

    async def _dispatch_turn(self, state: RunState, action: plan.DispatchTurn) -> RunState | Decided:
        if await self.waits.wait(action.branch_id, action.step_id, action.attempt, self.stopping, self.interrupt):
            return state  # the driver sees ``stopping`` (or the cancel) and plans again
        prepared = await prepare_turn(state, self.spec, action, attempts=self.attempts, bodies=self.bodies,
                                      memo=self.contexts, inline_max=self.inline_max)
        return await self._commit_starting(state, prepared.events, (), turn=prepared, branch_id=action.branch_id)

    # ---- commits -------------------------------------------------------------------------------
    async def _commit_starting(self, state: RunState, events: Sequence[AnyEvent], outcomes: Sequence[AttemptEnd], *,
                               branch_id: BranchId, calls: Sequence[plan.CallAttempt] = (),
                               turn: PreparedTurn | None = None, bodies: Sequence[tuple[bytes, str]] = (),
                               markers: Sequence[AttemptSucceeded] = ()) -> RunState | Decided:
        """One round trip: store ``bodies`` (and the prompt of ``turn``), publish the ``markers`` of successes,
        commit ``events`` (decided by :func:`planned_or_facts`); then start ``calls`` and ``turn`` — only
        if the planned events were committed. A Decided: nothing was recorded (the run moved)."""
        halted = self._budget_halt(state, events, outcomes, branch_id, calls, turn)
        if halted is None:
            events = self._with_code(state, events, branch_id)  # each intent names the code it runs
            halted = self._code_halt(state, events, branch_id, calls, turn)
        if halted is not None:  # a budget exceeded, or changed code under on_code_change fail: nothing started
            events, calls, turn = halted, (), None
        points = commit_points(events)  # fault injection (REEL_EXECUTOR_CRASH_AT, shared/core/run/crashpoints.py)
        self.attempts.crash_if(*points.before_intent)
        prompt = (await self.attempts.blobs.put_async(turn.body, JSON)
                  if turn is not None and not is_inline(turn.prompt_ref) else None)
        sent = await self.attempts.send_with(state, events, bodies, markers, crash_point=points.after_output)
        prompt_result: Any = (await asyncio.gather(prompt, return_exceptions=True))[0] if prompt is not None else None
        done = await self.attempts.commit(state, planned_or_facts(state.head_lsn, events, outcomes), sent=sent)
        if isinstance(done, Decided):
            return done
        self.attempts.crash_if(*commit_points(done.events).after_commit)
        if done.events != tuple(events):  # the run moved: only the outcomes went in; the driver plans again
            log.debug("agent.replanned", lsn=done.state.head_lsn, recorded=len(done.events))
            return done.state
        return await self._started(done, branch_id, calls, turn, prompt_result)

    def _budget_halt(self, state: RunState, events: Sequence[AnyEvent], outcomes: Sequence[AttemptEnd],
                     branch_id: BranchId, calls: Sequence[plan.CallAttempt], turn: PreparedTurn | None,
                     ) -> tuple[AnyEvent, ...] | None:
        """The commit recording a ``budget_exhausted`` halt in place of ``events`` when the model call of ``turn``
        (its worst case: its prompt's tokens, tool schemas included, + ``max_tokens``, priced) or the tool
        ``calls`` they start would exceed the run's budget, counting ``outcomes`` as spent
        (:func:`reel.shared.core.run.budget.check`); ``None`` when they fit (or the run has no budget)."""
        if (turn is None and not calls) or budget.budget_of(state.budget) is None:
            return None
        worst = None
        if turn is not None:
            model = turn.model
            worst = budget.worst_case(turn.prompt_tokens, model, price_for(model, self.spec.price_table))
        at = now_ms()
        found = budget.check(state, at, model_call=worst, tool_calls=len(calls), pending=[o.usage for o in outcomes])
        if found is None:
            return None
        step = turn.action.step_id if turn is not None else calls[0].step_id
        log.info("run.budget_exhausted", step_id=step, budget=found.budget, limit=found.limit, spent=found.spent,
                 needed=found.needed)
        return budget.halted_commit(events, found.event(branch_id, step, at), *_ended(step, turn))

    def _with_code(self, state: RunState, events: Sequence[AnyEvent], branch_id: BranchId) -> Sequence[AnyEvent]:
        """``events`` with each ``attempt_dispatched`` carrying the identity of the code it runs
        (:mod:`reel.shared.application.codeid`): a turn's model adapter, a call's tool."""
        if not any(isinstance(e, AttemptDispatched) for e in events):
            return events
        declared = {d.step_id: d for e in events if isinstance(e, StepsDeclared) for d in e.steps}
        branch = state.branches.get(branch_id)
        out: list[AnyEvent] = []
        for e in events:
            if isinstance(e, AttemptDispatched) and e.code is msgspec.UNSET:
                parsed = parse_step_id(e.step_id)
                if parsed is not None:
                    agent = self.spec.agent(parsed[0])
                    if parsed[2] < 0:
                        code = codeid.model_identity(agent.model)
                    else:
                        decl = declared.get(e.step_id) or (turnfold.declared(branch, e.step_id) if branch else None)
                        name = (decl.tool_name if decl is not None else None) or ""
                        tool = next((t for t in agent.tools if t.name == name), None)
                        code = (codeid.agent_tool_identity(tool, self.python_tools.get((agent.id, name)))
                                if tool is not None else codeid.builtin_identity(name))
                    e = msgspec.structs.replace(e, code=code)
            out.append(e)
        return out

    def _code_halt(self, state: RunState, events: Sequence[AnyEvent], branch_id: BranchId,
                   calls: Sequence[plan.CallAttempt], turn: PreparedTurn | None) -> tuple[AnyEvent, ...] | None:
        """Under ``on_code_change: fail``, the commit recording a ``code_changed`` halt in place of ``events`` when
        an attempt they dispatch would run other code than its tool's (or adapter's) earlier attempts on the branch
        (:func:`reel.shared.core.run.codeids.first_change`); else ``None``."""
        if self.spec.code_change_policy != "fail" or (turn is None and not calls):
            return None
        branch = state.branches.get(branch_id)
        if branch is None:
            return None
        intents = [(e.step_id, e.attempt, e.code) for e in events
                   if isinstance(e, AttemptDispatched) and isinstance(e.code, CodeIdentity)]
        change = codeids.first_change(branch, intents)
        if change is None:
            return None
        log.warning("run.code_changed", step_id=change.step_id, attempt=change.attempt, kind=change.now.kind,
                    name=change.now.name, what=list(change.what))
        step = turn.action.step_id if turn is not None else calls[0].step_id
        return budget.halted_commit(events, codeids.halt(change, branch_id, now_ms()), *_ended(step, turn))

    async def _started(self, done: Committed, branch_id: BranchId, calls: Sequence[plan.CallAttempt],
                       turn: PreparedTurn | None, prompt_result: Any) -> RunState:
        state = done.state
        branch = state.branches[branch_id]
        has_workspace = isinstance(state.workspace, BlobRef)  # unset: the run has none (no attempt records one)
        folder = await self.attempts.workspaces.prepare(state, branch_id) if calls and has_workspace else None
        for c in calls:
            decl = turnfold.declared(branch, c.step_id)
            assert decl is not None, c
            decl = requestfold.effective_decl(branch, decl)  # an approval's edited arguments
            key = (branch_id, c.step_id, c.attempt)
            ctx = CallContext(self.run_id, branch_id, c.step_id, c.attempt)
            ctx.workspace = None if folder is None else str(folder)
            if self._mcp_tool(c.step_id, decl.tool_name):  # an MCP tool's progress goes to its attempt's subject
                out = self.attempts.stream_out(self.run_id, branch_id, c.step_id, c.attempt, True)
                ctx.progress = None if out is None else out.progress
                from .elicit import Asker  # the mcp SDK: an optional extra, here since the workflow names a server

                ctx.elicit = Asker(self.attempts, self.run_id, branch_id, c.step_id, c.attempt, decl.tool_name or "",
                                   decl.call_id or "")
            self.tasks[key] = asyncio.create_task(call_tool(self.spec, key, decl, ctx, self.python_tools, self.bodies,
                                                            self.interrupt), name=f"call {c.step_id}#{c.attempt}")
        if calls:
            log.debug("agent.calls_dispatched", lsn=state.head_lsn, calls=[f"{c.step_id}#{c.attempt}" for c in calls])
        if turn is None:
            return state
        a = turn.action
        p = turn.partition
        log.debug("attempt.dispatched", lsn=state.head_lsn, step_id=a.step_id, attempt=a.attempt, packed=len(p.packed),
                 available=len(p.available), dropped=len(p.dropped), prompt_tokens=turn.prompt_tokens)
        key = (a.branch_id, a.step_id, a.attempt)
        if isinstance(prompt_result, BaseException):  # never call a model whose prompt is not stored
            failure = ModelError(f"prompt blob not stored: {prompt_result}", kind="prompt_store_failed")
            return await self._record_turn(state, TurnDone(turn, None, failure, 0.0), more=True)
        out = self.attempts.stream_out(self.run_id, a.branch_id, a.step_id, a.attempt, turn.request.stream)
        self.tasks[key] = asyncio.create_task(call_model(self.spec, turn, self.attempts.counter, self.interrupt, out),
                                              name=f"turn {a.step_id}#{a.attempt}")
        return state

    # ---- recording -----------------------------------------------------------------------------
    async def collect(self, state: RunState, *, more: bool = True) -> RunState:
        """Wait for at least one attempt in flight, then record what finished in one commit: a turn alone,
        or the calls of one turn (``more``: the commit may start the next turn or more calls).

        Raises:
            RunLost: the run was taken over meanwhile (the interrupt fired ``lost``): nothing is recorded.
        """
        if not self.tasks:
            raise RuntimeError("collect with nothing in flight")
        fired = () if self.interrupt is None else (self.interrupt.fired,)
        await asyncio.wait([*self.tasks.values(), *fired], return_when=asyncio.FIRST_COMPLETED)
        if lost(self.interrupt):  # taken over: the run's tools are killed already; nothing of them is recorded
            raise RunLost(state)
        if fired and fired[0].done():  # a cancel, or the drain deadline: stop everything in flight now
            running = [t for t in self.tasks.values() if not t.done()]
            for t in running:
                t.cancel()
            if running:
                log.info("agent.interrupted", cause=fired[0].result(), attempts=len(running))
                await asyncio.wait(running)  # each returns its ``interrupted`` result once stopped
        finished = [(k, t.result()) for k, t in self.tasks.items() if t.done()]
        self.attempts.crash_if(*(point_name(sid, n, "after_run") for (_, sid, n), _ in finished))  # fault injection
        first = finished[0][1]
        if isinstance(first, TurnDone):
            del self.tasks[finished[0][0]]
            return await self._record_turn(state, first, more=more)
        group = finished[0][0][1].rsplit(":", 1)[0], finished[0][0][0]  # (agent:turn, branch)
        batch = [d for k, d in finished if isinstance(d, CallDone) and (k[1].rsplit(":", 1)[0], k[0]) == group]
        for d in batch:
            del self.tasks[d.key]
        return await self._record_calls(state, batch, more=more)

    def _may_start(self, state: RunState, branch_id: BranchId, more: bool) -> bool:
        return (more and state.status in DRIVABLE and state.executor_id == self.me and state.active_branch == branch_id
                and not (self.stopping is not None and self.stopping.is_set()))

    async def _record_turn(self, state: RunState, done: TurnDone, *, more: bool) -> RunState:
        a = done.prepared.action
        where = (a.branch_id, a.step_id, a.attempt)
        if done.error is not None or done.response is None:
            exc = done.error or ModelError("no response", kind="empty_response")
            failure, error_body = modelout.failure(where, exc, modelout.failure_usage(exc, done.latency_ms),
                                                   inline_max=self.inline_max)
            delay = self.waits.failed(failure, exc, self.spec.agent(a.agent).model.adapter)
            log.info("attempt.failed", step_id=a.step_id, attempt=a.attempt, error_kind=exc.kind,
                     retryable=exc.retryable, retry_after_s=exc.retry_after_s, retry_in_s=round(delay, 3),
                     reason=exc.message[:200])
            return await self._record_turn_failure(state, failure, error_body)
        resp = done.response
        body = msgspec.json.encode(resp.message)  # the exact response message, keys in the provider's order
        usage = modelout.answer_usage(resp.input_tokens, resp.output_tokens, done.latency_ms, resp.cost_usd,
                                      resp.usage_source)
        ended, ref = modelout.answer_outcome(where, body=body, media_type=JSON, finish_reason=resp.finish_reason,
                                             usage=usage, policy=self.spec.agent(a.agent).truncation_policy,
                                             inline_max=self.inline_max)
        self.bodies.keep(body, ref)
        if isinstance(ended, AttemptFailed):  # a cut answer, not taken (on_truncated fail or retry)
            log.info("attempt.failed", step_id=a.step_id, attempt=a.attempt, error_kind=ended.error_kind,
                     retryable=ended.retryable, finish_reason=resp.finish_reason, reason=ended.message)
            return await self._record_turn_failure(state, ended, body)
        outcome = ended
        log.info("attempt.succeeded", step_id=a.step_id, attempt=a.attempt, tool_calls=len(resp.tool_calls),
                 input_tokens=usage.input_tokens, output_tokens=usage.output_tokens, usage_source=usage.source,
                 finish_reason=resp.finish_reason, latency_ms=round(usage.latency_ms, 3))
        if self._may_start(state, a.branch_id, more):
            out = ac.turn_outcome(state, a.branch_id, self.spec.agent(a.agent), a.turn, output_ref=ref,
                                  calls=resp.tool_calls, outcome=outcome, executor_id=self.me, at_ms=outcome.at_ms,
                                  approval=self.spec.approval)
        else:
            out = ac.TurnOutcome(events=(outcome,))
        bodies = [*([] if is_inline(ref) else [(body, JSON)]), *((b, JSON) for b in out.blobs)]
        return await self._recorded(state, out.events, [outcome], a.branch_id, calls=out.started, bodies=bodies,
                                    markers=[outcome])

    async def _record_turn_failure(self, state: RunState, failure: AttemptFailed, body: bytes | None) -> RunState:
        """Record a failed turn attempt (and the agent's end when it has no attempt left), with the whole body
        behind the failure (``failure.error_ref``) stored beside the commit."""
        events = ac.turn_failure(state, failure, at_ms=failure.at_ms)
        ref = failure.error_ref
        bodies = ([(body, ref.media_type)] if body is not None and isinstance(ref, BlobRef) and not is_inline(ref)
                  else [])
        return await self._recorded(state, events, [failure], failure.branch_id, bodies=bodies)

    async def _record_calls(self, state: RunState, batch: Sequence[CallDone], *, more: bool) -> RunState:
        outcomes: list[AttemptEnd] = []
        bodies: list[tuple[bytes, str]] = []
        changed, too_large = await self.attempts.snapshot(state, batch[0].key[0], self.spec.workspace)
        for d in batch:
            bid, sid, attempt = d.key
            if too_large is not None or d.error is not None or d.text is None:
                err = too_large or d.error or ToolError("no result", kind="tool_error")
                outcomes.append(msgspec.structs.replace(modelout.tool_failure(d.key, err, d.latency_ms),
                                                        workspace=changed))
                log.info("attempt.failed", step_id=sid, attempt=attempt, error_kind=err.kind, retryable=err.retryable,
                         reason=err.message[:200])
                continue
            body = secrets.scrub(d.text).encode()  # a python tool could return what the executor holds
            ref = ref_for(body, inline_max=self.inline_max)
            self.bodies.keep(body, ref)
            if not is_inline(ref):
                bodies.append((body, ref.media_type))
            outcomes.append(AttemptSucceeded(branch_id=bid, step_id=sid, attempt=attempt, output_ref=ref,
                                             usage=Usage(latency_ms=d.latency_ms), at_ms=now_ms(),
                                             truncated=True if d.truncated else msgspec.UNSET,
                                             workspace=changed))
            log.info("attempt.succeeded", step_id=sid, attempt=attempt, output_bytes=len(body),
                     latency_ms=round(d.latency_ms, 3))
        events: list[AnyEvent] = []
        for o in outcomes:  # at most one agent_finished (a fatal tool's end) per commit
            ended = any(isinstance(e, AgentFinished) for e in events)
            events += [e for e in ac.call_outcome(state, o, at_ms=o.at_ms) if not (ended and isinstance(e,
                                                                                                        AgentFinished))]
        bid = batch[0].key[0]
        nxt: PreparedTurn | None = None
        follow: plan.DispatchCalls | None = None
        if self._may_start(state, bid, more) and not any(isinstance(e, AgentFinished) for e in events):
            if ac.completes_turn(state, outcomes):
                agent = StepId(batch[0].key[1].split(":", 1)[0])
                nxt = await prepare_turn(state, self.spec, ac.next_turn(state, bid, agent), attempts=self.attempts,
                                         bodies=self.bodies, memo=self.contexts, outcomes=outcomes,
                                         inline_max=self.inline_max)
                events += nxt.events
            else:
                follow = ac.follow_up_calls(state, outcomes, self.in_flight)
                if follow is not None:
                    events += ac.call_intents(follow, executor_id=self.me, at_ms=now_ms())
        return await self._recorded(state, events, outcomes, bid, calls=follow.calls if follow else (), turn=nxt,
                                    bodies=bodies, markers=[o for o in outcomes if isinstance(o, AttemptSucceeded)])

    async def _recorded(self, state: RunState, events: Sequence[AnyEvent], outcomes: Sequence[AttemptEnd],
                        branch_id: BranchId, **starting: Any) -> RunState:
        done = await self._commit_starting(state, events, outcomes, branch_id=branch_id, **starting)
        return done.state if isinstance(done, Decided) else done


def _ended(step: StepId, turn: PreparedTurn | None) -> tuple[StepId, int]:
    """The agent step a halt before ``step`` ends, and how many turns it ran (``turn``: the turn about to start,
    whose declaration the halt drops when it was new)."""
    if turn is not None:
        return turn.action.agent, turn.action.turn - 1 if turn.action.declare else turn.action.turn
    parsed = parse_step_id(step)
    assert parsed is not None, step
    return parsed[0], parsed[1]
