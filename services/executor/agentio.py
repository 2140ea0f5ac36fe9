"""What the agent loop reads, runs and decides around its commits (services/executor/agent.py uses it).

* :func:`prepare_turn` — turn *t*'s candidates → partition → request
  (:func:`reel.shared.core.agent.turncontext.build_turn`'s result, built incrementally by
  :class:`reel.shared.core.agent.memo.ContextMemo`), the prompt body (the exact wire
  request) and the intent events (:func:`reel.shared.core.agent.commits.turn_intent`).
* :func:`planned_or_facts` — the decision of every agent commit: the planned events on
  the head they were planned on; on any other head only the outcomes not yet recorded
  (facts about side effects that happened), never an intent — the driver plans again.
* :func:`call_model`, :func:`call_tool` — the side effect of one in-flight attempt, run as
  a task: it never commits and never raises (an error is its result; a cancelled task — the
  drive's interrupt fired — returns an ``interrupted`` error, services/executor/interrupts.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from reel.shared.application.fenced import Decide
from reel.shared.core.agent import commits as ac
from reel.shared.core.agent import forkcontext, turnfold
from reel.shared.core.agent.memo import ContextMemo
from reel.shared.core.chat.messages import ChatRequest, ChatResponse, ToolCall, assign_call_ids
from reel.shared.core.decision import Decision
from reel.shared.core.errors import ModelError, ToolError
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.run import planning as plan
from reel.shared.core.run.events import AnyEvent, AttemptEnd, BlobRef, ContextPartition, DeclaredStep
from reel.shared.core.run.ids import AttemptNo, BranchId, ExecutorId, StepId
from reel.shared.core.run.state import RunState
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.core.workflow.prices import priced
from reel.shared.core.workflow.spec import WorkflowSpec
from reel.shared.nats.blobstore import ref_for
from reel.shared.nats.control import Interrupt
from reel.shared.runtime.clock import now_ms

from . import modelout
from .agenttools import CallContext, PythonTools, run_call
from .attempts import OUTCOME_RECORDED, RUN_MOVED, Attempts
from .bodies import Bodies
from .interrupts import Interrupted
from .streaming import StreamOut

JSON = modelout.JSON


class PreparedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """A turn attempt ready to commit: its intent events, the prompt body (``prompt_ref``'s), the request."""

    action: plan.DispatchTurn
    events: tuple[AnyEvent, ...]
    body: bytes
    prompt_ref: BlobRef
    request: ChatRequest
    partition: ContextPartition
    prompt_tokens: int  # the partition's packed + reserved tokens: Reel's estimate of the prompt (tools included)
    model: ModelSpec  # what the turn calls: the agent's, or a fork's edit of it


async def prepare_turn(state: RunState, spec: WorkflowSpec, action: plan.DispatchTurn, *, attempts: Attempts,
                       bodies: Bodies, memo: ContextMemo, outcomes: Sequence[AttemptEnd] = (),
                       inline_max: int = 0) -> PreparedTurn:
    """Build turn ``action.turn``'s request on ``state`` (``outcomes``: call results about to be committed
    with this intent) and the intent events; the prompt rides inline in its ref when at most ``inline_max``
    bytes. Only the earlier turns ``memo`` does not keep are read and
    rebuilt (:mod:`reel.shared.core.agent.memo`): the context is the one a full rebuild makes.

    Raises:
        BlobMissing, BlobTimeout: an earlier turn's blob cannot be read.
    """
    edits = forkcontext.turn_edits(state.branches[action.branch_id], action.step_id)
    agent = forkcontext.edited_agent(spec.agent(action.agent), edits)
    todo = memo.plan(state, action.branch_id, action.agent, action.turn, outcomes)
    blobs = await bodies.many(list(todo.refs)) if todo.refs else {}
    run_outputs = await attempts.outputs(state, action.branch_id,
                                         [c.from_step for c in agent.context if c.from_step is not None])
    ctx = memo.build(todo, state, action, agent, spec, run_outputs=run_outputs, blobs=blobs, outcomes=outcomes,
                     edits=edits)
    partition = ctx.packed.partition
    reserved = partition.reserved_tokens if isinstance(partition.reserved_tokens, int) else 0
    prompt_tokens = ctx.packed.packed_tokens + reserved  # Reel's estimate of the prompt: its tool schemas included
    request, body = modelout.request_body(msgspec.structs.replace(ctx.request, prompt_tokens=prompt_tokens))
    ref = ref_for(body, JSON, inline_max=inline_max)
    events = ac.turn_intent(state, action, executor_id=ExecutorId(attempts.executor_id), at_ms=now_ms(),
                            prompt_ref=ref, context=partition)
    return PreparedTurn(action=action, events=events, body=body, prompt_ref=ref, request=request,
                        partition=partition, prompt_tokens=prompt_tokens, model=agent.model)


def planned_or_facts(planned_head: int, events: Sequence[AnyEvent], outcomes: Sequence[AttemptEnd]) -> Decide:
    """``events`` on ``planned_head``; elsewhere the ``outcomes`` not recorded yet (or a Skip). Pure."""
    planned = tuple(events)

    def decide(state: RunState) -> Decision:
        if state.head_lsn == planned_head:
            return planned
        pending = tuple(o for o in outcomes if not plan.outcome_recorded(state, o.branch_id, o.step_id, o.attempt))
        if pending:
            return pending
        return OUTCOME_RECORDED if outcomes else RUN_MOVED
    return decide


def calls_of_message(state: RunState, action: plan.AdoptTurn, body: bytes) -> list[ToolCall]:
    """The tool calls of a recorded answer (the exact response message), ids assigned as the adapter did:
    empty or repeated ones (also against earlier turns' ids) replaced (:func:`assign_call_ids`)."""
    try:
        message: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return []
    raw = message.get("tool_calls") if isinstance(message, dict) else None
    calls = []
    for c in raw if isinstance(raw, list) else []:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        args = fn.get("arguments")
        text = args if isinstance(args, str) else "" if args is None else msgspec.json.encode(args).decode()
        calls.append(ToolCall(id=str(c.get("id") or ""), name=fn["name"], arguments=text))
    rec = turnfold.record(state.branches[action.branch_id], StepId(action.agent))
    taken = {c.decl.call_id for t in (rec.turns[:action.turn - 1] if rec else []) for c in t.calls if c.decl.call_id}
    return list(assign_call_ids(calls, turn=action.turn, taken=taken))


# ---- side effects: the tasks of in-flight attempts (they never commit and never raise) --------------
Key = tuple[BranchId, StepId, AttemptNo]


@dataclass(frozen=True)
class TurnDone:
    """A turn attempt's model call returned: the response, or the error; latency in ms."""

    prepared: PreparedTurn
    response: ChatResponse | None
    error: ModelError | None
    latency_ms: float


@dataclass(frozen=True)
class CallDone:
    """A tool call attempt returned: its output text, or the error; latency in ms; ``truncated``: the text is
    a command's head past its ``max_output_bytes`` (with the note the model reads)."""

    key: Key
    text: str | None
    error: ToolError | None
    latency_ms: float
    truncated: bool = False


Done = TurnDone | CallDone


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _stopped(interrupt: Interrupt | None) -> Interrupted:
    """What a side effect cancelled by ``interrupt`` reports (a cancel with no cause known: ``cancelled``)."""
    return Interrupted(interrupt.cause if interrupt is not None and interrupt.cause is not None else "cancelled")


async def call_model(spec: WorkflowSpec, prepared: PreparedTurn, counter: TokenCounter,
                     interrupt: Interrupt | None = None, out: StreamOut | None = None) -> TurnDone:
    """One model call of a turn attempt (:func:`~reel.services.executor.modelout.ask`); an error is a result,
    and so is being cancelled (``interrupted``: the HTTP request is aborted). ``out``: where a streamed response's
    fragments go (services/executor/streaming.py)."""
    started = time.perf_counter()
    try:
        resp = await modelout.ask(priced(prepared.model, spec.price_table), prepared.request,
                                  counter, out)
    except asyncio.CancelledError:
        stop = _stopped(interrupt)
        return TurnDone(prepared, None, ModelError(stop.message, kind=stop.kind), _ms_since(started))
    except ModelError as exc:
        return TurnDone(prepared, None, exc, _ms_since(started))
    return TurnDone(prepared, resp, None, _ms_since(started))


async def call_tool(spec: WorkflowSpec, key: Key, decl: DeclaredStep, ctx: CallContext, python_tools: PythonTools,
                    bodies: Bodies, interrupt: Interrupt | None = None) -> CallDone:
    """One attempt of the declared tool call ``decl`` (:func:`~reel.services.executor.agenttools.run_call`); being
    cancelled is a result too (``interrupted``: a command's group is killed, a Python tool's task cancelled,
    a sync Python tool's thread abandoned — its late result is discarded)."""
    started = time.perf_counter()
    try:
        args = (decl.arguments or "") if decl.arguments_ref is None else (
            await bodies.get(decl.arguments_ref)).decode(errors="replace")
        call = ToolCall(id=decl.call_id or "", name=decl.tool_name or "", arguments=args)
        text = await run_call(spec.agent(key[1].split(":", 1)[0]), call, ctx, python_tools)
    except asyncio.CancelledError:
        stop = _stopped(interrupt)
        return CallDone(key, None, ToolError(stop.message, kind=stop.kind), _ms_since(started))
    except ToolError as exc:
        return CallDone(key, None, exc, _ms_since(started))
    except Exception as exc:  # e.g. the arguments blob is unreadable: the attempt fails, retryably
        return CallDone(key, None, ToolError(f"{type(exc).__name__}: {exc}", kind="executor_error"),
                        _ms_since(started))
    return CallDone(key, text, None, _ms_since(started), truncated=ctx.truncated)
