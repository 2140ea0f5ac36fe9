"""The agent part of the fold: dynamic step declarations and agent outcomes (brief §11).

:mod:`shared.core.fold` keeps one :class:`AgentRecord` per agent step that has
started on a branch (``BranchState.agents``, absent from the encoding of a branch
without agents, so logs without agent steps fold to exactly what they did before).
An agent's record lists its turns in order, each with its tool calls in order, so
a dynamic step id (``solve:t2:c1``) finds its declaration by index in O(1), and the
declaration order *is* the step order ``(turn, call)`` of :mod:`shared.core.stepids`.

Attempts of dynamic steps live with every other attempt in ``BranchState.attempts``,
keyed by their step id. Every function here is O(1) per event (O(declarations) for
a fork, like the attempts it copies).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import msgspec

from shared.core.agentstate import AgentOutcome, AgentRecord, Declared, TurnRecord
from shared.core.errors import InvalidTransition
from shared.core.events import AgentFinished, DeclaredStep, StepDecl, StepsDeclared
from shared.core.ids import LSN, BranchId, StepId
from shared.core.state import BranchState, RunState, StepStatus
from shared.core.stepids import call_step_id, order_key, parse_step_id, turn_step_id

NO_CUTOFF = (1 << 62, 0, 0)
"""The cutoff key of a fork without ``from_step``: every step is before it."""


def agents_of(branch: BranchState) -> dict[StepId, AgentRecord]:
    """The branch's agent records (an empty dict, not stored, when it has none)."""
    return {} if branch.agents is msgspec.UNSET else branch.agents


def record(branch: BranchState, agent_step: StepId) -> AgentRecord | None:
    """The record of ``agent_step`` on ``branch`` (``None`` before its first turn)."""
    return None if branch.agents is msgspec.UNSET else branch.agents.get(agent_step)


def entry(branch: BranchState, step_id: StepId) -> TurnRecord | Declared | None:
    """The declaration record of a dynamic step on ``branch`` (O(1)); ``None`` if not declared (or not dynamic)."""
    parsed = parse_step_id(step_id)
    if parsed is None:
        return None
    rec = record(branch, parsed[0])
    if rec is None or parsed[1] > len(rec.turns):
        return None
    turn = rec.turns[parsed[1] - 1]
    if parsed[2] < 0:
        return turn
    return turn.calls[parsed[2]] if parsed[2] < len(turn.calls) else None


def declared(branch: BranchState, step_id: StepId) -> DeclaredStep | None:
    """The declaration of a dynamic step on ``branch`` (O(1)); ``None`` if not declared (or not dynamic)."""
    e = entry(branch, step_id)
    return e.decl if e is not None else None


def step_ids(steps: Sequence[StepDecl], branch: BranchState) -> Iterator[StepId]:
    """Every step id of ``branch`` in step order: the workflow's, each agent step followed by its dynamic steps."""
    for decl in steps:
        yield decl.step_id
        if decl.kind == "agent":
            for d in declarations(branch, decl.step_id):
                yield d.step_id


def declarations(branch: BranchState, agent_step: StepId) -> Iterator[DeclaredStep]:
    """The dynamic steps of ``agent_step`` on ``branch`` in step order: each turn, then its calls."""
    rec = record(branch, agent_step)
    for t in rec.turns if rec is not None else ():
        yield t.decl
        for c in t.calls:
            yield c.decl


def agent_status(branch: BranchState, step_id: StepId) -> StepStatus:
    """Status of an agent step: from its ``agent_finished``, else ``running`` once a turn is declared."""
    rec = record(branch, step_id)
    if rec is None or (not rec.turns and rec.finished is None):
        return StepStatus.PENDING
    return StepStatus(rec.finished.status) if rec.finished is not None else StepStatus.RUNNING


def _agent(state: RunState, step_id: StepId, what: str) -> None:
    try:
        kind = state.step_decl(step_id).kind
    except KeyError:
        kind = None
    if kind != "agent":
        raise InvalidTransition(f"{what} for {step_id!r}, which is not an agent step", run_id=state.run_id)


def _branch(state: RunState, branch_id: BranchId, what: str) -> BranchState:
    branch = state.branches.get(branch_id)
    if branch is None:
        raise InvalidTransition(f"{what} on unknown branch {branch_id!r}", run_id=state.run_id)
    return branch


def apply_declared(state: RunState, lsn: LSN, event: StepsDeclared) -> None:
    """Fold case of ``steps_declared``: append turns/calls in order, checking each id is the next one.

    Raises:
        InvalidTransition: unknown branch, not an agent step, an agent that finished,
            or a step id other than the next turn (``<agent>:t<n+1>``) / next call of the last turn.
    """
    branch = _branch(state, event.branch_id, "steps_declared")
    _agent(state, event.parent_step, "steps_declared")
    if branch.agents is msgspec.UNSET:
        branch.agents = {}
    rec = branch.agents.get(event.parent_step)
    if rec is None:
        rec = branch.agents[event.parent_step] = AgentRecord(step_id=event.parent_step)
    if rec.finished is not None:
        raise InvalidTransition(f"steps_declared for agent {event.parent_step!r}, which has finished",
                                run_id=state.run_id)
    for d in event.steps:
        n = len(rec.turns)
        if d.kind == "turn":
            expected = turn_step_id(event.parent_step, n + 1)
        else:
            expected = call_step_id(event.parent_step, n, len(rec.turns[-1].calls)) if n else StepId("<a turn first>")
        if d.step_id != expected or d.turn != (n + 1 if d.kind == "turn" else n):
            raise InvalidTransition(f"steps_declared: {d.kind} {d.step_id!r} (turn {d.turn}) is not the next"
                                    f" step of agent {event.parent_step!r} (expected {expected!r})",
                                    run_id=state.run_id)
        if d.kind == "turn":
            rec.turns.append(TurnRecord(decl=d, lsn=lsn))
        else:
            rec.turns[-1].calls.append(Declared(decl=d, lsn=lsn))


def apply_finished(state: RunState, lsn: LSN, event: AgentFinished) -> None:
    """Fold case of ``agent_finished``.

    Raises:
        InvalidTransition: unknown branch, not an agent step, or already finished.
    """
    branch = _branch(state, event.branch_id, "agent_finished")
    _agent(state, event.step_id, "agent_finished")
    if branch.agents is msgspec.UNSET:
        branch.agents = {}
    rec = branch.agents.setdefault(event.step_id, AgentRecord(step_id=event.step_id))
    if rec.finished is not None:
        raise InvalidTransition(f"agent {event.step_id!r} finished twice on {event.branch_id}", run_id=state.run_id)
    rec.finished = AgentOutcome(status=event.status, output_ref=event.output_ref, turns=event.turns,
                                error_kind=event.error_kind, message=event.message, lsn=lsn, at_ms=event.at_ms)


def is_fork_point(state: RunState, step_id: StepId) -> bool:
    """A step a fork may start from: a workflow step, or a turn/call id of one of its agent steps."""
    parsed = parse_step_id(step_id)
    try:
        decl = state.step_decl(parsed[0] if parsed else step_id)
    except KeyError:
        return False
    return parsed is None or decl.kind == "agent"


def cutoff_key(positions: Mapping[StepId, int], from_step: StepId | None) -> tuple[int, int, int]:
    """The order key a fork keeps the steps strictly before (:data:`NO_CUTOFF` without ``from_step``)."""
    return NO_CUTOFF if from_step is None else order_key(positions, from_step)


def inherit(parent: BranchState, positions: Mapping[StepId, int], fork_lsn: LSN,
            cutoff: tuple[int, int, int]) -> dict[StepId, AgentRecord] | msgspec.UnsetType:
    """The parent's agent records a fork keeps: declared at or below ``fork_lsn`` and ordered before ``cutoff``.

    ``agent_finished`` is kept only when the whole agent is before the cutoff (a fork
    from ``solve:t2`` keeps turn 1 and its calls; one from ``solve`` keeps nothing of it).
    """
    out: dict[StepId, AgentRecord] = {}
    for agent_id, rec in agents_of(parent).items():
        index = positions[agent_id]
        turns: list[TurnRecord] = []
        for t in rec.turns:
            if t.lsn > fork_lsn or (index, t.decl.turn, -1) >= cutoff:
                break
            calls = [c for i, c in enumerate(t.calls) if c.lsn <= fork_lsn and (index, t.decl.turn, i) < cutoff]
            turns.append(TurnRecord(decl=t.decl, lsn=t.lsn, calls=calls))
        done = rec.finished
        keep = done if done is not None and done.lsn <= fork_lsn and cutoff[0] > index else None
        if turns or keep is not None:
            out[agent_id] = AgentRecord(step_id=agent_id, turns=turns, finished=keep)
    return out if out else msgspec.UNSET
