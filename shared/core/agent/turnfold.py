"""The agent part of the fold: dynamic step declarations and agent outcomes.

:mod:`reel.shared.core.run.fold` keeps one :class:`AgentRecord` per agent step that has
started on a branch (``BranchState.agents``, absent from the encoding of a branch
without agents, so logs without agent steps fold to exactly what they did before).
An agent's record lists its turns in order, each with its tool calls in order, so
a dynamic step id (``solve:t2:c1``) finds its declaration by index in O(1), and the
declaration order *is* the step order ``(turn, call)`` of :mod:`reel.shared.core.run.stepids`.

Attempts of dynamic steps live with every other attempt in ``BranchState.attempts``,
keyed by their step id. The records are frozen (:mod:`reel.shared.core.agent.turnstate`): the
fold cases here are pure — :func:`declare` and :func:`finish` take an agent's record
and return the next one, sharing every unchanged turn — and :mod:`reel.shared.core.run.fold`
keeps the records in its accumulator. Every function here is O(1) per event (the
turns are a persistent vector; O(declarations) for a fork, like the attempts it keeps).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import msgspec

from reel.shared.core.agent.turnstate import AgentOutcome, AgentRecord, Declared, TurnRecord
from reel.shared.core.errors import InvalidTransition
from reel.shared.core.run.events import AgentFinished, DeclaredStep, StepDecl, StepsDeclared
from reel.shared.core.run.ids import LSN, RunId, StepId
from reel.shared.core.run.persistent import FrozenMap, FrozenVector
from reel.shared.core.run.state import BranchState, RunState, Steps, agent_status
from reel.shared.core.run.stepids import NO_CUTOFF, call_step_id, cutoff_key, parse_step_id, turn_step_id

__all__ = ["NO_CUTOFF", "agent_status", "agents_of", "cutoff_key", "declarations", "declare", "declared",
           "entry", "entry_in", "finish", "inherit", "is_fork_point", "record", "step_ids"]

_NONE: FrozenMap[StepId, AgentRecord] = FrozenMap()


def agents_of(branch: BranchState) -> Mapping[StepId, AgentRecord]:
    """The branch's agent records (an empty mapping, not stored, when it has none)."""
    return _NONE if branch.agents is msgspec.UNSET else branch.agents


def record(branch: BranchState, agent_step: StepId) -> AgentRecord | None:
    """The record of ``agent_step`` on ``branch`` (``None`` before its first turn)."""
    return None if branch.agents is msgspec.UNSET else branch.agents.get(agent_step)


def entry(branch: BranchState, step_id: StepId) -> TurnRecord | Declared | None:
    """The declaration record of a dynamic step on ``branch`` (O(1)); ``None`` if not declared (or not dynamic)."""
    parsed = parse_step_id(step_id)
    return None if parsed is None else entry_in(record(branch, parsed[0]), parsed)


def entry_in(rec: AgentRecord | None, parsed: tuple[StepId, int, int]) -> TurnRecord | Declared | None:
    """The declaration record of the dynamic step ``parsed`` (:func:`~reel.shared.core.run.stepids.parse_step_id`) in
    its agent's record ``rec`` (O(1)); ``None`` if not declared."""
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


def _agent(steps: Steps, step_id: StepId, what: str, run_id: RunId) -> None:
    if not steps.declares(step_id) or steps[steps.position(step_id)].kind != "agent":
        raise InvalidTransition(f"{what} for {step_id!r}, which is not an agent step", run_id=run_id)


def declare(steps: Steps, rec: AgentRecord | None, event: StepsDeclared, lsn: LSN, run_id: RunId) -> AgentRecord:
    """Fold case of ``steps_declared`` on the agent's record (``None``: none yet): the next record, turns and
    calls appended in order, each id checked to be the next one.

    Raises:
        InvalidTransition: not an agent step, an agent that finished, or a step id other than the
            next turn (``<agent>:t<n+1>``) / next call of the last turn.
    """
    _agent(steps, event.parent_step, "steps_declared", run_id)
    rec = rec if rec is not None else AgentRecord(step_id=event.parent_step)
    if rec.finished is not None:
        raise InvalidTransition(f"steps_declared for agent {event.parent_step!r}, which has finished", run_id=run_id)
    turns = rec.turns
    for d in event.steps:
        n = len(turns)
        if d.kind == "turn":
            expected = turn_step_id(event.parent_step, n + 1)
        else:
            expected = call_step_id(event.parent_step, n, len(turns[-1].calls)) if n else StepId("<a turn first>")
        if d.step_id != expected or d.turn != (n + 1 if d.kind == "turn" else n):
            raise InvalidTransition(f"steps_declared: {d.kind} {d.step_id!r} (turn {d.turn}) is not the next"
                                    f" step of agent {event.parent_step!r} (expected {expected!r})", run_id=run_id)
        if d.kind == "turn":
            turns = turns.append(TurnRecord(decl=d, lsn=lsn))
        else:
            last = turns[-1]
            turns = turns.replace(-1, msgspec.structs.replace(last, calls=(*last.calls, Declared(decl=d, lsn=lsn))))
    return msgspec.structs.replace(rec, turns=turns)


def finish(steps: Steps, rec: AgentRecord | None, event: AgentFinished, lsn: LSN, run_id: RunId) -> AgentRecord:
    """Fold case of ``agent_finished`` on the agent's record (``None``: none yet): the next record.

    Raises:
        InvalidTransition: not an agent step, or already finished.
    """
    _agent(steps, event.step_id, "agent_finished", run_id)
    rec = rec if rec is not None else AgentRecord(step_id=event.step_id)
    if rec.finished is not None:
        raise InvalidTransition(f"agent {event.step_id!r} finished twice on {event.branch_id}", run_id=run_id)
    return msgspec.structs.replace(rec, finished=AgentOutcome(
        status=event.status, output_ref=event.output_ref, turns=event.turns, error_kind=event.error_kind,
        message=event.message, lsn=lsn, at_ms=event.at_ms))


def is_fork_point(state: RunState, step_id: StepId) -> bool:
    """A step a fork may start from: a workflow step, or a turn/call id of one of its agent steps."""
    parsed = parse_step_id(step_id)
    try:
        decl = state.step_decl(parsed[0] if parsed else step_id)
    except KeyError:
        return False
    return parsed is None or decl.kind == "agent"


def inherit(parent: BranchState, positions: Mapping[StepId, int], fork_lsn: LSN,
            cutoff: tuple[int, int, int]) -> FrozenMap[StepId, AgentRecord] | msgspec.UnsetType:
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
            calls = tuple(c for i, c in enumerate(t.calls) if c.lsn <= fork_lsn and (index, t.decl.turn, i) < cutoff)
            turns.append(t if calls == t.calls else msgspec.structs.replace(t, calls=calls))  # unchanged: shared
        done = rec.finished
        keep = done if done is not None and done.lsn <= fork_lsn and cutoff[0] > index else None
        if turns or keep is not None:
            out[agent_id] = AgentRecord(step_id=agent_id, turns=FrozenVector.of(turns), finished=keep)
    return FrozenMap.of(out) if out else msgspec.UNSET
