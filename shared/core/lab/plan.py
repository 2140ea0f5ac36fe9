"""One run of a lab, decided: what to fork (branch, turn, edit) and its verdict before; then its verdict after.

:func:`plan_fork` is the lab's decision for a run at rest (pure: the folded run and its workflow as stored);
the shell sends the plan's fork command, waits for the fork to rest and asks :func:`judge_fork`.
"""

from __future__ import annotations

import msgspec

from reel.shared.core.lab import point as pt
from reel.shared.core.lab import tally as ty
from reel.shared.core.lab.labspec import LabSpec
from reel.shared.core.run.compare import branch_facts
from reel.shared.core.run.forkedits import ContextEdit
from reel.shared.core.run.ids import BranchId, StepId
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec


class ForkPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The fork a lab makes of one run, and what the run said before it."""

    base: BranchId
    verifiers: tuple[str, ...]
    turn: StepId
    edit: ContextEdit
    before: str
    before_usage: ty.Usage


def base_branch(state: RunState, spec: LabSpec) -> BranchId:
    """The branch forked and judged *before*: the SPEC's ``branch``, else the run's root branch."""
    if spec.branch is not None:
        return BranchId(spec.branch)
    return next(b for b, st in state.branches.items() if st.parent_branch_id is None)


def _agent_spec(workflow: WorkflowSpec | None, agent: str) -> AgentStep | None:
    if workflow is None:
        return None
    return next((st for st in workflow.steps if isinstance(st, AgentStep) and st.id == agent), None)


def plan_fork(state: RunState, spec: LabSpec, workflow: WorkflowSpec | None) -> ForkPlan | pt.Skip:
    """What the lab forks of ``state`` (see the module docstring), or why it leaves the run out.

    Args:
        workflow: the run's workflow as stored (``None``: unreadable; an item of a kind is then unknown).
    """
    base = base_branch(state, spec)
    if base not in state.branches:
        return pt.Skip(f"no branch {base}")
    verifiers = ty.judged_by(spec.verifiers, state.verifiers)
    if isinstance(verifiers, pt.Skip):
        return verifiers
    view = build_episode_view(state, base)
    agent = pt.choose_agent(view, spec.agent)
    if isinstance(agent, pt.Skip):
        return agent
    facts = branch_facts(state, view)
    before = ty.branch_verdict(facts.verdicts, verifiers)
    agent_spec = _agent_spec(workflow, agent)
    turn = pt.fork_turn(view, agent, spec.at, agent_spec)
    edit = pt.resolve_edit(spec.edit, agent_spec)
    if isinstance(before, pt.Skip):
        return before
    if isinstance(turn, pt.Skip):
        return turn
    if isinstance(edit, pt.Skip):
        return edit
    return ForkPlan(base=base, verifiers=verifiers, turn=turn, edit=edit, before=before,
                    before_usage=ty.usage_of(facts))


def judge_fork(state: RunState, plan: ForkPlan, branch: BranchId) -> tuple[str, ty.Usage] | pt.Skip:
    """The fork's verdict and usage once it rests (``pt.Skip``: a verifier has not judged it)."""
    facts = branch_facts(state, build_episode_view(state, branch))
    after = ty.branch_verdict(facts.verdicts, plan.verifiers)
    if isinstance(after, pt.Skip):
        return pt.Skip(f"after the fork: {after.reason}")
    return after, ty.usage_of(facts)
