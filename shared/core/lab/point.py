"""Where a lab forks one run, and the edit it sends there: pure functions of the branch's view and the agent.

:func:`fork_turn` turns the SPEC's point (:mod:`reel.shared.core.lab.labspec`) into the agent turn the fork re-runs
(``replay:t12``), or a :class:`Skip` saying why the run has no such turn; :func:`resolve_edit` turns the SPEC's
edit into the fork edit for that run (an item ``{kind: task}`` becomes the run's task item id). Whether the edit
fits the turn is the rewind service's to say (``check_edits``): a lab sends what ``reel fork`` would send.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from reel.shared.core.lab.labspec import (
    AfterFailingTool,
    EditTemplate,
    FirstDropped,
    ItemEdit,
    ItemRef,
    JudgedPoint,
    Point,
    TurnPoint,
    describe_item,
)
from reel.shared.core.run.forkedits import ContextEdit, Drop, Restore
from reel.shared.core.run.ids import ContextItemId, StepId
from reel.shared.core.run.state import StepStatus
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.run.views import EpisodeView, StepView
from reel.shared.core.workflow.spec import AgentStep


class Skip(msgspec.Struct, frozen=True):
    """A run the lab leaves out, and why (one sentence: ``no turn 14 (the agent ran 13)``)."""

    reason: str


def choose_agent(view: EpisodeView, name: str | None) -> StepId | Skip:
    """The agent step forked: ``name``, else the run's one agent step."""
    agents = [s.step_id for s in view.steps if s.kind == "agent"]
    if name is not None:
        return StepId(name) if name in agents else Skip(
            f"no agent step {name!r} (agents: {', '.join(agents) or 'none'})")
    if len(agents) != 1:
        return Skip(f"{len(agents)} agent steps ({', '.join(agents)}): name one with agent:" if agents
                    else "no agent step")
    return agents[0]


def turns(view: EpisodeView, agent: StepId) -> list[StepView]:
    """The agent's turns on the branch that recorded a partition, in turn order."""
    found = [s for s in view.steps if s.kind == "model" and s.parent_step == agent
             and (a := s.final_attempt) is not None and a.context is not None]
    return sorted(found, key=lambda s: _turn_no(s.step_id))


def _turn_no(step: StepId) -> int:
    parsed = parse_step_id(step)
    return parsed[1] if parsed is not None else 0


def fork_turn(view: EpisodeView, agent: StepId, point: Point, spec: AgentStep | None) -> StepId | Skip:
    """The turn of ``agent`` on the branch ``view`` shows where ``point`` falls (see the module docstring).

    Args:
        spec: the agent step as the workflow declares it (its context items name kinds), if known.
    """
    ran = turns(view, agent)
    if not ran:
        return Skip(f"agent {agent} recorded no turn")
    match point:
        case TurnPoint(turn=k):
            index = k - 1 if k > 0 else len(ran) + k
            if not 0 <= index < len(ran):
                return Skip(f"no turn {k} (the agent ran {len(ran)})")
            return ran[index].step_id
        case JudgedPoint(verifier=v):
            return _judged(view, agent, v, {s.step_id for s in ran})
        case AfterFailingTool():
            return _after_failing(view, agent, ran)
        case FirstDropped(item=ref):
            item = resolve_item(ref, spec)
            if isinstance(item, Skip):
                return item
            for t in ran:
                part = t.final_attempt.context if t.final_attempt is not None else None
                if part is not None and item in part.dropped:
                    return t.step_id
            return Skip(f"no turn dropped {item}")
    return Skip(f"unknown point {point!r}")


def _judged(view: EpisodeView, agent: StepId, verifier: str, ran: set[StepId]) -> StepId | Skip:
    judged = [v for v in view.verdicts if v.verifier == verifier]
    if not judged:
        return Skip(f"no verdict of {verifier} on {view.branch_id}")
    step = judged[-1].step_id
    if step is None or step not in ran:
        return Skip(f"{verifier} judged {step or 'the run'}, not a turn of {agent}")
    return step


def _after_failing(view: EpisodeView, agent: StepId, ran: Sequence[StepView]) -> StepId | Skip:
    failing = next((s for s in view.steps if s.kind == "tool" and s.parent_step == agent
                    and (s.is_error is True or s.status == StepStatus.FAILED)), None)
    if failing is None:
        return Skip("no tool call failed")
    parsed = parse_step_id(failing.step_id)
    after = next((t.step_id for t in ran if parsed is not None and _turn_no(t.step_id) > parsed[1]), None)
    return after if after is not None else Skip(f"{failing.step_id} failed in the agent's last turn")


def resolve_item(ref: ItemRef, spec: AgentStep | None) -> ContextItemId | Skip:
    """The item id ``ref`` names in this run: itself, or the agent's one context item of the kind."""
    if isinstance(ref, str):
        return ContextItemId(ref)
    if spec is None:
        return Skip(f"the workflow could not be read: {describe_item(ref)} is unknown")
    found = [c.id for c in spec.context if c.kind == ref.kind]
    if len(found) != 1:
        return Skip(f"{len(found)} context items of kind {ref.kind}" + (f" ({', '.join(found)})" if found else ""))
    return ContextItemId(found[0])


def resolve_edit(edit: EditTemplate, spec: AgentStep | None) -> ContextEdit | Skip:
    """The fork edit ``edit`` is for this run (an item of a kind resolved; every other edit as it is)."""
    if not isinstance(edit, ItemEdit):
        return edit
    item = resolve_item(edit.item, spec)
    if isinstance(item, Skip):
        return item
    return Restore(item=item) if edit.op == "restore" else Drop(item=item)

