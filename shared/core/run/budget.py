"""A run's spend against its budget (docs/workflow.md, "Budgets"): a fold of recorded usage, and the check made
before every model call and every tool call. Pure: the clock comes in as an argument.

* :func:`spend` — what the run has spent, summed over every attempt of every branch, each counted once (a
  branch's inherited attempts are its parent's): tokens and USD of model attempts, tool attempts
  dispatched, wall seconds since creation. Usage whose source is ``estimated`` (Reel's own count: the server
  sent none) counts like any other, and is reported apart (:attr:`Spend.estimated_tokens`).
* :func:`worst_case` — a model call's worst case: its prompt tokens plus its ``max_tokens`` (the model's
  ``params.max_tokens`` / ``max_completion_tokens``, else :data:`DEFAULT_MAX_OUTPUT_TOKENS`), priced.
* :func:`check` — the first limit the next call would exceed, or ``None``; :meth:`Exhausted.event` is the
  ``step_halted`` (``budget_exhausted``) that records it.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from reel.shared.core.run.eventfields import usage_source
from reel.shared.core.run.events import (
    AgentFinished,
    AnyEvent,
    AttemptCancelled,
    AttemptFailed,
    AttemptSucceeded,
    Budget,
    StepHalted,
    Usage,
)
from reel.shared.core.run.ids import BranchId, StepId
from reel.shared.core.run.state import RunState
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.workflow.modelspec import ModelSpec, Price

DEFAULT_MAX_OUTPUT_TOKENS = 4096
"""The output tokens a model call's worst case counts when its model sets no ``max_tokens`` (tokens)."""

LIMITS = ("max_tokens", "max_cost_usd", "max_wall_s", "max_tool_calls")
"""The limits of a :class:`~reel.shared.core.run.events.Budget`, in the order they are checked."""


class Spend(msgspec.Struct, frozen=True, kw_only=True):
    """What a run has spent so far.

    Attributes:
        input_tokens, output_tokens: of every model attempt with an outcome (tokens).
        estimated_tokens: the part of both whose usage source is ``estimated`` (Reel's own count).
        cost_usd: of every model attempt (USD).
        tool_calls: tool attempts dispatched (an agent's calls and tool steps; every attempt, open ones too).
        model_calls: model attempts dispatched.
        wall_s: seconds since the run was created (as of the ``now_ms`` asked at).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    estimated_tokens: int = 0
    cost_usd: float = 0.0
    tool_calls: int = 0
    model_calls: int = 0
    wall_s: float = 0.0

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def figure(self, limit: str) -> float:
        """The figure a limit of :data:`LIMITS` is checked against."""
        return {"max_tokens": float(self.tokens), "max_cost_usd": self.cost_usd, "max_wall_s": self.wall_s,
                "max_tool_calls": float(self.tool_calls)}[limit]


class Worst(msgspec.Struct, frozen=True, kw_only=True):
    """A model call's worst case: ``prompt_tokens`` + ``max_tokens`` tokens, ``cost_usd`` USD."""

    prompt_tokens: int
    max_tokens: int
    cost_usd: float

    @property
    def tokens(self) -> int:
        """Prompt plus output tokens at most."""
        return self.prompt_tokens + self.max_tokens


class Exhausted(msgspec.Struct, frozen=True, kw_only=True):
    """The limit ``budget`` (of :data:`LIMITS`, value ``limit``) the next call would exceed: the run has spent
    ``spent`` and the call needs ``needed`` at worst (tokens, USD, seconds or calls)."""

    budget: str
    limit: float
    spent: float
    needed: float
    estimated: bool = False

    @property
    def message(self) -> str:
        """One line: the limit and the figures, e.g. ``max_cost_usd 0.002: spent 0.0012 + next model call at
        worst 0.0031 > 0.002``."""
        what = {"max_tokens": "model call", "max_cost_usd": "model call", "max_wall_s": "call",
                "max_tool_calls": "tool call"}[self.budget]
        if self.budget == "max_wall_s":
            return f"max_wall_s {_num(self.limit)}: {_num(self.spent)} s since the run was created"
        note = " (part of the spend is estimated usage)" if self.estimated else ""
        return (f"{self.budget} {_num(self.limit)}: spent {_num(self.spent)} + next {what} at worst "
                f"{_num(self.needed)} > {_num(self.limit)}{note}")

    def event(self, branch_id: BranchId, step_id: StepId, at_ms: int) -> StepHalted:
        """The ``step_halted`` recording it (``at_ms``: epoch ms)."""
        return StepHalted(branch_id=branch_id, step_id=step_id, reason="budget_exhausted", message=self.message,
                          budget=self.budget, limit=self.limit, spent=self.spent, needed=self.needed, at_ms=at_ms)


def _num(x: float) -> str:
    return f"{x:.6g}"


def budget_of(b: Budget | msgspec.UnsetType) -> Budget | None:
    """A run's budget from its ``RunState.budget`` (``run_created.budget``), ``None`` when it has no limit."""
    return b if isinstance(b, Budget) and b.limits else None


def _is_tool(state: RunState, step_id: StepId) -> bool:
    steps = state.steps
    if steps.declares(step_id):
        return steps[steps.position(step_id)].kind == "tool"
    parsed = parse_step_id(step_id)
    return parsed is not None and parsed[2] >= 0


def spend(state: RunState, now_ms: int, pending: Iterable[Usage] = ()) -> Spend:
    """What ``state``'s run has spent, as of ``now_ms`` (epoch ms); ``pending``: usage of outcomes about to be
    committed, counted too. O(attempts of the run)."""
    once: dict[tuple[StepId, int, int], Usage | None] = {}  # an intent (step, attempt, its LSN): its usage
    tools = models = 0
    for branch in state.branches.values():
        for step_id, attempts in branch.attempts.items():
            for a in attempts:
                key = (step_id, a.attempt, a.dispatched_lsn)
                if key not in once:  # a fork's inherited attempt is its parent's: counted once
                    if _is_tool(state, step_id):
                        tools += 1
                    else:
                        models += 1
                    once[key] = None
                if a.outcome_lsn is not None and once[key] is None:
                    once[key] = a.usage
    usages = [*pending, *(u for u in once.values() if u is not None)]
    inp = out = est = 0
    cost = 0.0
    for u in usages:
        inp, out, cost = inp + u.input_tokens, out + u.output_tokens, cost + u.cost_usd
        if usage_source(u) == "estimated":
            est += u.input_tokens + u.output_tokens
    return Spend(input_tokens=inp, output_tokens=out, estimated_tokens=est, cost_usd=round(cost, 10),
                 tool_calls=tools, model_calls=models, wall_s=max(0, now_ms - state.created_ms) / 1000)


def max_output_tokens(model: ModelSpec) -> int:
    """The output tokens a call of ``model`` may take: its ``params.max_tokens`` (or ``max_completion_tokens``),
    else :data:`DEFAULT_MAX_OUTPUT_TOKENS`."""
    params = model.request_params
    for key in ("max_tokens", "max_completion_tokens"):
        value = params.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MAX_OUTPUT_TOKENS


def worst_case(prompt_tokens: int, model: ModelSpec, price: Price | None) -> Worst:
    """A call of ``model`` with ``prompt_tokens`` in (Reel's count of the packed request): that plus its
    :func:`max_output_tokens`, priced by ``price`` (``None``: USD 0)."""
    most = max_output_tokens(model)
    cost = price.cost_usd(prompt_tokens, most) if price is not None else 0.0
    return Worst(prompt_tokens=prompt_tokens, max_tokens=most, cost_usd=cost)


def check(state: RunState, now_ms: int, *, model_call: Worst | None = None, tool_calls: int = 0,
          pending: Iterable[Usage] = ()) -> Exhausted | None:
    """The first limit of the run's budget (in :data:`LIMITS` order) that the next calls would exceed, or ``None``.

    Args:
        model_call: the worst case of a model call about to be made (``None``: none is).
        tool_calls: tool attempts about to be dispatched.
        pending: usage of outcomes committed with them (counted as spent).

    A limit is exceeded when spent + needed > limit (``max_wall_s``: when the seconds since creation are at
    or past it). With no model call and no tool call nothing is checked.
    """
    budget = budget_of(state.budget)
    if budget is None or (model_call is None and tool_calls <= 0):
        return None
    s = spend(state, now_ms, pending)
    estimated = s.estimated_tokens > 0
    if model_call is not None:
        if budget.max_tokens is not None and s.tokens + model_call.tokens > budget.max_tokens:
            return Exhausted(budget="max_tokens", limit=budget.max_tokens, spent=s.tokens, needed=model_call.tokens,
                             estimated=estimated)
        if budget.max_cost_usd is not None and s.cost_usd + model_call.cost_usd > budget.max_cost_usd:
            return Exhausted(budget="max_cost_usd", limit=budget.max_cost_usd, spent=s.cost_usd,
                             needed=model_call.cost_usd, estimated=estimated)
    if budget.max_wall_s is not None and s.wall_s >= budget.max_wall_s:
        return Exhausted(budget="max_wall_s", limit=budget.max_wall_s, spent=s.wall_s, needed=0.0)
    if budget.max_tool_calls is not None and tool_calls > 0 and s.tool_calls + tool_calls > budget.max_tool_calls:
        return Exhausted(budget="max_tool_calls", limit=budget.max_tool_calls, spent=s.tool_calls,
                         needed=tool_calls)
    return None


def summary(state: RunState, now_ms: int) -> str:
    """``reel show``'s budget line: each limit set, spend against it (e.g. ``$0.0012 of $0.002``), and whether
    estimated usage is part of it; ``""`` for a run without a budget."""
    budget = budget_of(state.budget)
    if budget is None:
        return ""
    s = spend(state, now_ms if state.finished_ms is None else state.finished_ms)
    parts = []
    if budget.max_tokens is not None:
        est = f" ({s.estimated_tokens} estimated)" if s.estimated_tokens else ""
        parts.append(f"{s.tokens} of {budget.max_tokens} tokens{est}")
    if budget.max_cost_usd is not None:
        est = " (with estimated usage)" if s.estimated_tokens else ""
        parts.append(f"${s.cost_usd:.4f} of ${budget.max_cost_usd:g}{est}")
    if budget.max_wall_s is not None:
        parts.append(f"{s.wall_s:.1f} of {budget.max_wall_s:g} s")
    if budget.max_tool_calls is not None:
        parts.append(f"{s.tool_calls} of {budget.max_tool_calls} tool calls")
    return ", ".join(parts)


def halted_commit(events: Iterable[AnyEvent], halt: StepHalted, agent: StepId | None,
                  turns: int) -> tuple[AnyEvent, ...]:
    """The commit that records a halt instead of the planned ``events``: their outcomes (facts about calls that
    ran) and nothing they would have started — no intent, no declaration, no input request — then ``halt`` and,
    for an agent step (``agent``), its end: ``agent_finished`` ``failed`` after ``turns`` turns, with the halt's
    reason as its ``error_kind``. Pure."""
    kept: list[AnyEvent] = [e for e in events if isinstance(e, AttemptSucceeded | AttemptFailed | AttemptCancelled)]
    kept.append(halt)
    if agent is not None:
        kept.append(AgentFinished(branch_id=halt.branch_id, step_id=agent, status="failed", turns=turns,
                                  error_kind=halt.reason, message=halt.message, at_ms=halt.at_ms))
    return tuple(kept)
