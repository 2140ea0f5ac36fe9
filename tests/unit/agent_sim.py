"""A reference driver of the agent loop's pure core, in memory (no server, no clock): what the executor does.

It follows the contract of :mod:`reel.shared.core.agent.actions` literally — ask ``next_action``
with the attempts it has in flight, commit what the builders of
:mod:`reel.shared.core.agent.commits` return, build each turn with
:mod:`reel.shared.core.agent.turncontext` — with the ``scripted`` model (``play_turn``) and tools
given as plain functions (``recorded`` tools of the spec answer from their recording unless a function of the
same name is given). Tool calls run "concurrently": they are started when their
intents commit and finish one at a time, oldest first, whenever the core says ``Wait``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from reel.shared.core.agent import commits as ac
from reel.shared.core.agent.turncontext import build_turn, needed_blobs
from reel.shared.core.chat.messages import ToolCall, wire_request
from reel.shared.core.errors import ModelError
from reel.shared.core.input import requestfold
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run import planning as plan
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    Commit,
    RunCreated,
    RunStarted,
    RunVerifying,
)
from reel.shared.core.run.fold import apply_commit
from reel.shared.core.run.ids import AttemptNo, BranchId, ExecutorId, RunId, StepId
from reel.shared.core.run.planning import TextFacts
from reel.shared.core.run.state import RunState
from reel.shared.core.workflow.agentspec import RecordedToolSpec
from reel.shared.core.workflow.spec import WorkflowSpec
from reel.shared.models.scripted import play_turn, scripted_turn

X = ExecutorId("x-sim")
_CALL_ID = "\0call_id"  # how a recorded tool is told which call it answers
ToolFn = Callable[[dict[str, Any]], str]  # raises to fail (the message is the observation)


class Sim:
    """One run of ``spec``; ``commits`` holds every commit's events, in order."""

    def __init__(self, spec: WorkflowSpec, tools: dict[str, ToolFn], run_id: str = "r-sim") -> None:
        self.spec, self.tools = spec, dict(tools)
        for step in spec.steps:
            for t in getattr(step, "tools", ()):
                if t.recorded is not None and t.name not in self.tools:
                    self.tools[t.name] = _recorded(t.recorded)
        self.run_id = RunId(run_id)
        self.state: RunState | None = None
        self.log: list[tuple[int, Commit]] = []
        self.blobs: dict[str, bytes] = {}
        self.in_flight: list[tuple[BranchId, StepId, AttemptNo]] = []
        self.requests: list[dict[str, Any]] = []  # every wire_request body sent, in order
        self.facts = TextFacts(DEFAULT_COUNTER)
        self.now = 1000

    # ---- the log and the blob store ----------------------------------------------------------------
    def commit(self, events: tuple[AnyEvent, ...] | list[AnyEvent]) -> RunState:
        lsn = (self.log[-1][0] if self.log else 0) + 1
        c = Commit(commit_id=f"c{lsn}", run_id=self.run_id, writer=X, events=tuple(events))
        self.log.append((lsn, c))
        self.state = apply_commit(self.state, lsn, c)
        return self.state

    def put(self, body: bytes, media: str = "application/json") -> BlobRef:
        ref = ac.json_ref(body)
        self.blobs[ref.sha256] = body
        return BlobRef(sha256=ref.sha256, size_bytes=ref.size_bytes, media_type=media)

    def tick(self) -> int:
        self.now += 1
        return self.now

    # ---- driving ---------------------------------------------------------------------------------
    def start(self) -> RunState:
        return self.commit([RunCreated(run_id=self.run_id, branch_id=BranchId("main"), workflow_name=self.spec.name,
                                       workflow_ref=self.put(b"{}"), steps=self.spec.decls(), created_ms=1)])

    def run(self, max_actions: int = 200) -> RunState:
        """Drive until the run rests (or ``max_actions``); returns the state."""
        if self.state is None:
            self.start()
        for _ in range(max_actions):
            assert self.state is not None
            action = plan.next_action(self.state, X, self.in_flight)
            if isinstance(action, plan.Rest):
                break
            self.perform(action)
        assert self.state is not None
        return self.state

    def perform(self, action: plan.Action) -> None:
        assert self.state is not None
        if isinstance(action, plan.Claim):
            self.commit([RunStarted(executor_id=X, at_ms=self.tick())])
        elif isinstance(action, plan.EnterVerifying):
            self.commit([RunVerifying(branch_id=action.branch_id, at_ms=self.tick())])
        elif isinstance(action, plan.Dispatch):  # model/tool steps: a recorded answer
            self.commit([AttemptDispatched(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                           executor_id=X, at_ms=self.tick())])
            self.commit([AttemptSucceeded(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                          output_ref=self.put(f"out of {action.step_id}".encode(), "text/plain"),
                                          at_ms=self.tick())])
        elif isinstance(action, plan.DispatchTurn):
            self.commit(self.turn_intent(action, ()))
            self.answer(action)
        elif isinstance(action, plan.DispatchCalls):
            self.commit(ac.call_intents(action, executor_id=X, at_ms=self.tick()))
            self.in_flight += [(action.branch_id, c.step_id, c.attempt) for c in action.calls]
        elif isinstance(action, plan.Wait):
            self.finish_one_call()
        elif isinstance(action, plan.ResolveUnknown):
            self.commit(ac.unknown_outcomes(self.state, action, at_ms=self.tick()))
        elif isinstance(action, plan.AdoptTurn):
            message = msgspec.json.decode(self.blobs[action.output_ref.sha256])
            calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                     for c in message.get("tool_calls") or []]
            out = ac.turn_outcome(self.state, action.branch_id, self.spec.agent(action.agent), action.turn,
                                  output_ref=action.output_ref, calls=calls, outcome=None, executor_id=X,
                                  at_ms=self.tick(), approval=self.spec.approval)
            self.commit(out.events)
            self.in_flight += [(action.branch_id, c.step_id, c.attempt) for c in out.started]
        elif isinstance(action, plan.FinishAgent | plan.AwaitInput):
            self.commit([action.event(self.tick())])
        else:
            raise AssertionError(action)

    def turn_intent(self, action: plan.DispatchTurn, outcomes: tuple[AttemptSucceeded | AttemptFailed, ...]
                    ) -> tuple[AnyEvent, ...]:
        """The intent events of ``action`` (the prompt blob stored), its context built with ``outcomes``."""
        assert self.state is not None
        agent = self.spec.agent(action.agent)
        for ref in needed_blobs(self.state, action.branch_id, action.agent, action.turn, outcomes):
            assert ref.sha256 in self.blobs, ref
        ctx = build_turn(self.state, action, agent, self.spec, run_outputs={}, blobs=self.blobs, facts=self.facts,
                         outcomes=outcomes)
        body = msgspec.json.encode(wire_request(ctx.request))
        self.requests.append(wire_request(ctx.request))
        self._pending_request = ctx.request
        return ac.turn_intent(self.state, action, executor_id=X, at_ms=self.tick(), prompt_ref=self.put(body),
                              context=ctx.packed.partition)

    def answer(self, action: plan.DispatchTurn) -> None:
        """Call the scripted model for the turn whose intent just committed; commit its outcome."""
        assert self.state is not None
        agent = self.spec.agent(action.agent)
        try:
            resp = play_turn(agent.model, scripted_turn(agent.model, action.turn), self._pending_request,
                             DEFAULT_COUNTER)
        except ModelError as exc:
            failure = AttemptFailed(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                    error_kind=exc.kind, message=exc.message, retryable=exc.retryable,
                                    at_ms=self.tick())
            self.commit(ac.turn_failure(self.state, failure, at_ms=self.now))
            return
        ref = self.put(msgspec.json.encode(resp.message))
        outcome = AttemptSucceeded(branch_id=action.branch_id, step_id=action.step_id, attempt=action.attempt,
                                   output_ref=ref, at_ms=self.tick())
        out = ac.turn_outcome(self.state, action.branch_id, agent, action.turn, output_ref=ref,
                              calls=resp.tool_calls, outcome=outcome, executor_id=X, at_ms=self.now,
                              approval=self.spec.approval)
        for body in out.blobs:
            self.put(body)
        self.commit(out.events)
        self.in_flight += [(action.branch_id, c.step_id, c.attempt) for c in out.started]

    def finish_one_call(self) -> None:
        """The oldest in-flight call returns; its outcome commit carries the next turn's intent when it is the last."""
        assert self.state is not None and self.in_flight
        bid, sid, attempt = self.in_flight.pop(0)
        decl = self.state.branches[bid].agents[StepId(sid.split(":")[0])].turns[-1].calls  # type: ignore[union-attr]
        d = requestfold.effective_decl(self.state.branches[bid], next(c.decl for c in decl if c.decl.step_id == sid))
        args = d.arguments if d.arguments is not None else self.blobs[d.arguments_ref.sha256].decode()  # type: ignore
        outcome: AttemptSucceeded | AttemptFailed
        try:
            fn = self.tools[d.tool_name or ""]
        except KeyError:
            outcome = AttemptFailed(branch_id=bid, step_id=sid, attempt=attempt, error_kind="unknown_tool",
                                    message=f"no tool named {d.tool_name!r}", retryable=False, at_ms=self.tick())
        else:
            try:
                text = fn({**msgspec.json.decode(args), _CALL_ID: d.call_id}) if getattr(fn, "recorded", False) \
                    else fn(msgspec.json.decode(args))
                outcome = AttemptSucceeded(branch_id=bid, step_id=sid, attempt=attempt, at_ms=self.tick(),
                                           output_ref=self.put(text.encode(), "text/plain"))
            except Exception as exc:
                outcome = AttemptFailed(branch_id=bid, step_id=sid, attempt=attempt, error_kind="tool_error",
                                        message=str(exc), retryable=False, at_ms=self.tick())
        events = list(ac.call_outcome(self.state, outcome, at_ms=self.now))
        nxt = None
        more = ac.follow_up_calls(self.state, [outcome], self.in_flight)
        if ac.completes_turn(self.state, [outcome]):
            nxt = ac.next_turn(self.state, bid, StepId(sid.split(":")[0]))
            events += self.turn_intent(nxt, (outcome,))
        elif more is not None:
            events += ac.call_intents(more, executor_id=X, at_ms=self.now)
        self.commit(events)
        if more is not None and nxt is None:
            self.in_flight += [(bid, c.step_id, c.attempt) for c in more.calls]
        if nxt is not None:
            self.answer(nxt)


def _recorded(rec: RecordedToolSpec) -> ToolFn:
    """A recorded tool: the result recorded for the call's id, else ``output``; a recorded error raises."""
    def fn(args: dict[str, Any]) -> str:
        call_id = args[_CALL_ID]
        if call_id in rec.errors:
            raise RuntimeError(rec.errors[call_id])
        return rec.by_call_id.get(call_id, rec.output or "")
    fn.recorded = True  # type: ignore[attr-defined]
    return fn
