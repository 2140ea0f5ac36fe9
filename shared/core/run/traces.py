"""A run's log as OpenTelemetry spans following the GenAI semantic conventions (pure: no I/O, no SDK).

:func:`run_spans` maps the commits of one run (``[(lsn, Commit)]``, as read from its subject)
and its workflow to :class:`SpanRecord` values; ``shared/runtime/otel.py`` turns them into SDK spans and
exports them. The mapping (OpenTelemetry semantic conventions, GenAI agent and model spans):

* one trace per run: ``trace_id`` = the first 16 bytes of sha256(``reel-trace\\0<run_id>``);
* ``invoke_agent <workflow>`` per **branch** (kind ``INTERNAL``; a forked branch's parent is the
  span of the branch it forked from), from its ``run_created`` / ``branch_forked`` to its last
  event; its verdicts are ``gen_ai.evaluation.result`` events (``gen_ai.evaluation.name`` = the
  verifier, ``score.value``, ``score.label`` = ``pass``/``fail``/``error``, ``explanation``);
* ``invoke_agent <step>`` per agent step on a branch (its turns and tool calls under it);
* ``chat <model>`` per **model attempt** (kind ``CLIENT``): ``gen_ai.request.model``,
  ``gen_ai.provider.name`` (the adapter), ``gen_ai.usage.input_tokens`` / ``output_tokens`` (with
  ``reel.usage.source``: ``reported``, ``estimated``, ``recorded`` or ``none``), and
  ``gen_ai.response.finish_reasons`` (``[reason]``, as the server sent it; absent when it sent none);
* ``execute_tool <name>`` per **tool attempt** (kind ``INTERNAL``): ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id`` (an agent's tool call), ``gen_ai.tool.type`` = ``function``.

An attempt's span runs from its ``attempt_dispatched`` to its outcome (``at_ms``); a failed one has
status ``ERROR`` and ``error.type`` = its error kind; one still in flight ends where it started, with
``reel.attempt.status`` = ``dispatched``. Span ids are the first 8 bytes of sha256 over
(run id, branch, LSN of the dispatching commit, step, attempt) — nothing random — so exporting
the same log twice gives the same ids (an idempotent re-export), and a longer log only adds spans.
Times are ns since the epoch. Reel attributes are ``reel.*`` (run, branch, step, attempt, LSNs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from reel.shared.core.run.eventfields import Usage, usage_source
from reel.shared.core.run.events import (
    AgentFinished,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BranchForked,
    Commit,
    RunCancelled,
    RunCompleted,
    RunCreated,
    StepsDeclared,
    VerdictRecorded,
)
from reel.shared.core.workflow.spec import AgentStep, ModelStep, ToolStep, WorkflowSpec

AttrValue = str | int | float | bool | tuple[str, ...]
SpanKind = Literal["INTERNAL", "CLIENT"]
MS = 1_000_000  # ns per ms


@dataclass(frozen=True)
class SpanEvent:
    """One event of a span (``gen_ai.evaluation.result``): name, time (ns), attributes."""

    name: str
    time_ns: int
    attributes: Mapping[str, AttrValue]


@dataclass(frozen=True)
class SpanRecord:
    """One span: ids (``trace_id`` 128-bit, ``span_id`` / ``parent_id`` 64-bit ints), name, kind,
    start/end (ns since the epoch), status (``UNSET``/``OK``/``ERROR`` with a description), attributes, events."""

    trace_id: int
    span_id: int
    parent_id: int | None
    name: str
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttrValue]
    status: Literal["UNSET", "OK", "ERROR"] = "UNSET"
    status_description: str = ""
    events: tuple[SpanEvent, ...] = ()


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()


def trace_id_of(run_id: str) -> int:
    """The run's trace id (128 bits, never 0)."""
    return int.from_bytes(_digest("reel-trace", run_id)[:16], "big") or 1


def span_id_of(run_id: str, *key: object) -> int:
    """A span id (64 bits, never 0) from the run id and ``key`` (branch, LSN, step, attempt, …)."""
    return int.from_bytes(_digest("reel-span", run_id, *key)[:8], "big") or 1


@dataclass
class _Open:
    """A span being built."""

    span_id: int
    parent_id: int | None
    name: str
    kind: SpanKind
    start_ns: int
    attributes: dict[str, AttrValue]
    end_ns: int = 0
    status: Literal["UNSET", "OK", "ERROR"] = "UNSET"
    description: str = ""
    events: list[SpanEvent] = field(default_factory=list)

    def touch(self, at_ns: int) -> None:
        self.end_ns = max(self.end_ns, self.start_ns, at_ns)


def _model_of(spec: AgentStep | ModelStep) -> tuple[str, str]:
    """(request model, provider) of a model or agent step."""
    m = spec.model
    model = m.model if isinstance(m.model, str) else (m.name or m.adapter)
    return model, m.adapter


def _usage(attrs: dict[str, AttrValue], usage: Usage, kind: str) -> None:
    if kind == "model":
        attrs["gen_ai.usage.input_tokens"] = usage.input_tokens
        attrs["gen_ai.usage.output_tokens"] = usage.output_tokens
        attrs["reel.usage.source"] = usage_source(usage)
    if usage.cost_usd:
        attrs["reel.usage.cost_usd"] = usage.cost_usd
    if usage.latency_ms:
        attrs["reel.usage.latency_ms"] = usage.latency_ms


def run_spans(log: Sequence[tuple[int, Commit]], workflow: WorkflowSpec | None = None) -> list[SpanRecord]:
    """The spans of one run's log (see module doc), in the order their first commit appears.

    ``workflow`` names each model attempt's model (else the step id stands in). An empty log has no spans.
    """
    if not log:
        return []
    run_id = log[0][1].run_id
    trace = trace_id_of(run_id)
    steps = {s.id: s for s in workflow.steps} if workflow is not None else {}
    kinds: dict[str, str] = {}
    parents: dict[str, str] = {}  # an agent's turn/tool call → the agent step
    tools: dict[str, tuple[str, str | None]] = {}  # tool step → (name, call id)
    branches: dict[str, _Open] = {}
    agents: dict[tuple[str, str], _Open] = {}
    attempts: dict[tuple[str, str, int], _Open] = {}
    spans: list[_Open] = []
    name = workflow.name if workflow is not None else "run"

    def branch_span(branch: str, at_ns: int) -> _Open:
        if branch not in branches:  # a branch seen before its creation event (never in a valid log)
            branches[branch] = _Open(span_id_of(run_id, branch), None, f"invoke_agent {name}", "INTERNAL", at_ns,
                                     _agent_attrs(name, run_id, branch))
            spans.append(branches[branch])
        return branches[branch]

    def agent_span(branch: str, step: str, at_ns: int) -> _Open:
        key = (branch, step)
        if key not in agents:
            parent = branch_span(branch, at_ns)
            agents[key] = _Open(span_id_of(run_id, branch, "agent", step), parent.span_id, f"invoke_agent {step}",
                                "INTERNAL", at_ns, {**_agent_attrs(step, run_id, branch), "reel.step_id": step})
            spans.append(agents[key])
        return agents[key]

    for lsn, commit in log:
        for ev in commit.events:
            if isinstance(ev, RunCreated):
                name = workflow.name if workflow is not None else ev.workflow_name
                kinds.update({s.step_id: s.kind for s in ev.steps})
                b = branch_span(ev.branch_id, ev.created_ms * MS)
                b.name, b.attributes = f"invoke_agent {name}", _agent_attrs(name, run_id, ev.branch_id)
                b.attributes["reel.created_lsn"] = lsn
                b.touch(ev.created_ms * MS)
            elif isinstance(ev, BranchForked):
                parent = branches.get(ev.parent_branch_id)
                b = branch_span(ev.branch_id, ev.at_ms * MS)
                b.parent_id = parent.span_id if parent is not None else None
                b.attributes.update({"reel.parent_branch_id": ev.parent_branch_id, "reel.fork_lsn": ev.fork_lsn})
                b.touch(ev.at_ms * MS)
            elif isinstance(ev, StepsDeclared):
                for d in ev.steps:
                    kinds[d.step_id] = "model" if d.kind == "turn" else "tool"
                    parents[d.step_id] = ev.parent_step
                    if d.kind == "tool_call":
                        tools[d.step_id] = (d.tool_name or d.step_id, d.call_id)
            elif isinstance(ev, AttemptDispatched):
                at = ev.at_ms * MS
                agent = parents.get(ev.step_id)
                parent = agent_span(ev.branch_id, agent, at) if agent else branch_span(ev.branch_id, at)
                span = _attempt_span(run_id, lsn, ev, kinds.get(ev.step_id, "model"), parent.span_id,
                                     steps.get(agent or ev.step_id), tools.get(ev.step_id))
                attempts[(ev.branch_id, ev.step_id, ev.attempt)] = span
                spans.append(span)
                parent.touch(at)
                branch_span(ev.branch_id, at).touch(at)
            elif isinstance(ev, AttemptSucceeded | AttemptFailed | AttemptCancelled):
                done = attempts.get((ev.branch_id, ev.step_id, ev.attempt))
                if done is None:
                    continue
                done.touch(ev.at_ms * MS)
                _usage(done.attributes, ev.usage, "model" if done.kind == "CLIENT" else "tool")
                done.attributes["reel.outcome_lsn"] = lsn
                if isinstance(ev, AttemptSucceeded | AttemptFailed) and isinstance(ev.finish_reason, str):
                    done.attributes["gen_ai.response.finish_reasons"] = (ev.finish_reason,)
                if isinstance(ev, AttemptSucceeded):
                    done.attributes["reel.attempt.status"], done.status = "succeeded", "OK"
                elif isinstance(ev, AttemptFailed):
                    done.attributes["reel.attempt.status"], done.attributes["error.type"] = "failed", ev.error_kind
                    done.status, done.description = "ERROR", ev.message[:500]
                else:
                    done.attributes["reel.attempt.status"] = "cancelled"
                for holder in (agents.get((ev.branch_id, parents.get(ev.step_id, ""))), branches.get(ev.branch_id)):
                    if holder is not None:
                        holder.touch(ev.at_ms * MS)
            elif isinstance(ev, AgentFinished):
                a = agent_span(ev.branch_id, ev.step_id, ev.at_ms * MS)
                a.touch(ev.at_ms * MS)
                a.attributes.update({"reel.agent.status": ev.status, "reel.agent.turns": ev.turns})
                if ev.error_kind:
                    a.status, a.description, a.attributes["error.type"] = "ERROR", ev.message[:500], ev.error_kind
            elif isinstance(ev, VerdictRecorded):
                v = ev.verdict
                b = branch_span(v.branch_id, v.at_ms * MS)
                b.events.append(SpanEvent("gen_ai.evaluation.result", v.at_ms * MS, {
                    "gen_ai.evaluation.name": v.verifier, "gen_ai.evaluation.score.value": v.score,
                    "gen_ai.evaluation.score.label": v.status, "gen_ai.evaluation.explanation": v.reason[:500],
                    "reel.snapshot_lsn": v.snapshot_lsn, "reel.lsn": lsn}))
                b.touch(v.at_ms * MS)
            elif isinstance(ev, RunCompleted):
                b = branch_span(ev.branch_id, ev.at_ms * MS)
                b.touch(ev.at_ms * MS)
                b.attributes["reel.outcome"] = ev.outcome
                b.status = "ERROR" if ev.outcome in ("failed", "error") else "OK"
            elif isinstance(ev, RunCancelled):
                for b in branches.values():
                    b.touch(ev.at_ms * MS)
                    b.attributes["reel.cancelled_lsn"] = lsn
    return [SpanRecord(trace_id=trace, span_id=s.span_id, parent_id=s.parent_id, name=s.name, kind=s.kind,
                       start_ns=s.start_ns, end_ns=max(s.end_ns, s.start_ns), attributes=dict(s.attributes),
                       status=s.status, status_description=s.description, events=tuple(s.events)) for s in spans]


def _agent_attrs(name: str, run_id: str, branch: str) -> dict[str, AttrValue]:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name, "gen_ai.conversation.id": run_id,
            "reel.run_id": run_id, "reel.branch_id": branch}


def _attempt_span(run_id: str, lsn: int, ev: AttemptDispatched, kind: str, parent: int,
                  spec: object, tool: tuple[str, str | None] | None) -> _Open:
    attrs: dict[str, AttrValue] = {"reel.run_id": run_id, "reel.branch_id": ev.branch_id, "reel.step_id": ev.step_id,
                                   "reel.attempt": ev.attempt, "reel.dispatch_lsn": lsn,
                                   "reel.executor_id": ev.executor_id, "reel.attempt.status": "dispatched"}
    sid = span_id_of(run_id, ev.branch_id, lsn, ev.step_id, ev.attempt)
    if kind == "model":
        model, provider = _model_of(spec) if isinstance(spec, AgentStep | ModelStep) else (ev.step_id, "")
        attrs.update({"gen_ai.operation.name": "chat", "gen_ai.request.model": model})
        if provider:
            attrs["gen_ai.provider.name"] = provider
        if ev.context is not None:
            attrs["reel.context.packed"] = len(ev.context.packed)
            attrs["reel.context.available"] = len(ev.context.available)
            attrs["reel.context.dropped"] = len(ev.context.dropped)
        return _Open(sid, parent, f"chat {model}", "CLIENT", ev.at_ms * MS, attrs)
    name, call_id = tool or ((spec.tool.name or ev.step_id) if isinstance(spec, ToolStep) else ev.step_id, None)
    attrs.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.type": "function"})
    if call_id:
        attrs["gen_ai.tool.call.id"] = call_id
    return _Open(sid, parent, f"execute_tool {name}", "INTERNAL", ev.at_ms * MS, attrs)
