"""An MCP server's elicitation during a call, as an input request of the run (docs/integrations.md).

The call stays open in this executor (the stdio server is its own process) while the request waits:
:class:`Asker` commits an ``input_requested`` of kind ``elicitation`` for the running call with a
``run_awaiting_input`` (the run rests; its drive drains, which waits for this call), then reads the run's log
until the request is answered (``reel answer RUN Q TEXT``, which wakes the run; ``reel reject``: the server is
told ``decline``) or cannot be any more (the run cancelled or rewound, the call over: ``cancel``). An executor that
dies while it waits takes the call with it: once the request is answered (which wakes the run) the next one
runs the call again if it is retry-safe (its elicitation is asked again, as a new request), else records it
``outcome_unknown``.

The answer's text becomes the elicitation's ``content``: a JSON object as it is; any other text, for a schema
of one field, that field's value (converted to its ``integer``, ``number`` or ``boolean`` type).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import structlog
from mcp import types

from reel.shared.core.decision import Decision, Skip
from reel.shared.core.input import requestfold
from reel.shared.core.input.requestevents import InputRequested, RunAwaitingInput
from reel.shared.core.input.requeststate import InputResponse
from reel.shared.core.run import planning as plan
from reel.shared.core.run.ids import AttemptNo, BranchId, StepId, request_id_for
from reel.shared.core.run.state import DRIVABLE, LIVE, RunState
from reel.shared.runtime.clock import now_ms

from .attempts import Attempts

log = structlog.get_logger("reel.executor")

POLL_S = 0.2
"""How often a waiting elicitation reads the run's log for its answer (s)."""


def hint(schema: dict[str, Any]) -> str:
    """What the answer should look like, from the requested schema (appended to the question)."""
    props = schema.get("properties") or {}
    if len(props) == 1:
        name, prop = next(iter(props.items()))
        return f" (answer: {name}, {prop.get('type', 'a value')})"
    if props:
        fields = ", ".join(f'"{n}": {p.get("type", "…")}' for n, p in props.items())
        return f" (answer with a JSON object: {{{fields}}})"
    return ""


def _typed(text: str, prop: dict[str, Any]) -> Any:
    kind = prop.get("type")
    if kind == "integer":
        return int(text.strip())
    if kind == "number":
        return float(text.strip())
    if kind == "boolean":
        return text.strip().lower() in ("true", "yes", "y", "1")
    return text


def result_of(response: InputResponse, schema: dict[str, Any]) -> types.ElicitResult:
    """The server's answer for a request's ``response``."""
    if response.decision != "answer":
        return types.ElicitResult(action="decline")
    text = response.text
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return types.ElicitResult(action="accept", content=parsed)
    props = schema.get("properties") or {}
    if len(props) == 1:
        name, prop = next(iter(props.items()))
        try:
            return types.ElicitResult(action="accept", content={name: _typed(text, prop)})
        except ValueError:
            log.warning("mcp.elicitation_unconvertible", field=name, type=prop.get("type"))
    return types.ElicitResult(action="decline")


class Asker:
    """Answers the elicitations of one call attempt with input requests of its run (``await asker(message,
    schema)``, :data:`reel.services.executor.mcptools.Elicit`)."""

    def __init__(self, attempts: Attempts, run_id: str, branch_id: BranchId, step_id: StepId, attempt: int,
                 tool_name: str, call_id: str) -> None:
        self.attempts, self.run_id, self.branch_id, self.step_id = attempts, run_id, branch_id, step_id
        self.attempt, self.tool_name, self.call_id = attempt, tool_name, call_id
        self._n = itertools.count(1)

    def _over(self, state: RunState) -> str | None:
        if state.status not in LIVE or state.active_branch != self.branch_id:
            return f"the run is {state.status} on branch {state.active_branch}"
        if plan.outcome_recorded(state, self.branch_id, self.step_id, AttemptNo(self.attempt)):
            return "the call is over"
        return None

    async def __call__(self, message: str, schema: dict[str, Any]) -> types.ElicitResult:
        rid = request_id_for(self.run_id, self.branch_id, f"{self.step_id}#{self.attempt}.{next(self._n)}")
        event = InputRequested(branch_id=self.branch_id, request_id=rid, step_id=self.step_id, kind="elicitation",
                               tool_name=self.tool_name, call_id=self.call_id, asked=f"the user of {self.tool_name}",
                               question=message + hint(schema), at_ms=now_ms())

        def decide(state: RunState) -> Decision:
            over = self._over(state)
            if over is not None:
                return Skip(over)
            rest = (RunAwaitingInput(branch_id=self.branch_id, at_ms=event.at_ms),) if state.status in DRIVABLE \
                else ()
            return (event, *rest)

        done = await self.attempts.commit(await self.attempts.log.load(self.run_id), decide)
        state = done.state
        log.info("mcp.elicitation_asked", run_id=self.run_id, step_id=self.step_id, request_id=rid,
                 lsn=state.head_lsn)
        while True:
            rec = requestfold.request_of(state.branches[self.branch_id], self.step_id)
            if rec is None or rec.request_id != rid or rec.status == "closed" or self._over(state) is not None:
                return types.ElicitResult(action="cancel")
            if rec.response is not None:
                log.info("mcp.elicitation_answered", run_id=self.run_id, request_id=rid,
                         decision=rec.response.decision)
                return result_of(rec.response, schema)
            state, new = await self.attempts.log.refresh(state)
            if not new:
                await asyncio.sleep(POLL_S)
