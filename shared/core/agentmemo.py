"""Incremental agent-turn contexts: a turn's packing cost grows with what is new and what is packed, not with the
number of earlier turns (brief §11, §13; issue 11).

:func:`shared.core.agentcontext.build_turn` rebuilds turn *t*'s candidates from every
earlier turn — reading their blobs, decoding answers, counting tokens — so an agent's
*t*-th turn costs O(t) of that work and a run of T turns O(T²). Yet an earlier turn's
items (its assistant message and its tool results, :func:`~shared.core.agentcontext.group_items`)
are a pure function of a few objects of the folded state: its
:class:`~shared.core.agentstate.TurnRecord`, the attempts of the turn and of each of its
calls, each call's input request, and the outcome about to be committed with the intent
(if any). :class:`ContextMemo` keeps, per agent step, each earlier turn's items together
with those objects (its *signature*), their packer candidates and their transcript messages.
A turn compares each earlier turn's signature with the one kept — by identity first (the fold
shares every unchanged object between states), by value otherwise — and rebuilds only the
turns whose signature differs: the newest turn, once; every turn after a rewind onto a branch
whose records are not shared, or after a drive starts. Reading a signature is a few dict
look-ups per turn; everything that depends on text is done once per turn and kept.

Then :func:`~shared.core.packer.pack` takes the candidates (its fast path: when everything
fits and no policy drops anything, no ranking), and the transcript is the kept messages of the
packed turns. A cache of a pure function keyed by all of its inputs: the context is the one a
full rebuild makes, byte for byte (tests/unit/test_agent_memo.py and
tests/integration/test_agent_incremental.py compare them on every turn).

Two passes keep this pure, like :mod:`shared.core.agentcontext`: :meth:`ContextMemo.plan`
says which blobs the stale turns need, :meth:`ContextMemo.build` makes the context from
their bodies. No I/O; the executor holds one memo per drive (services/executor/agent.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from shared.core import agentfold
from shared.core.agent import DispatchTurn
from shared.core.agentcontext import (
    EarlierTurn,
    Outcome,
    TurnContext,
    TurnItem,
    earlier_turn,
    group_items,
    head_items,
    item_message,
    tool_schemas,
    turn_candidates,
    turn_messages,
    turn_refs,
)
from shared.core.agentstate import TurnRecord
from shared.core.chat import ChatMessage, chat_request
from shared.core.events import BlobRef
from shared.core.fold import BranchState, RunState
from shared.core.ids import BranchId, StepId
from shared.core.packer import Candidate, pack
from shared.core.planning import TextFacts, policy_for
from shared.core.workflow import AgentStep, WorkflowSpec

Signature = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class TurnGroup:
    """One earlier turn as the context uses it: its items, their candidates and messages (same order)."""

    signature: Signature
    items: tuple[TurnItem, ...]
    candidates: tuple[Candidate, ...]
    messages: tuple[ChatMessage, ...]


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """What :meth:`ContextMemo.build` needs for one turn: the kept groups (``None`` where stale), the stale
    turns to rebuild with their signatures, and the blobs they read (``refs``)."""

    branch_id: BranchId
    agent: StepId
    turn: int
    groups: tuple[TurnGroup | None, ...]
    stale: tuple[tuple[int, EarlierTurn, Signature], ...]
    refs: tuple[BlobRef, ...]


def signature(branch: BranchState, t: TurnRecord, by_step: Mapping[str, Outcome]) -> Signature:
    """Every object of the state the items of the earlier turn ``t`` are derived from (see the module docstring)."""
    attempts = branch.attempts
    requests = None if branch.requests is msgspec.UNSET else branch.requests
    sig: list[object] = [t, attempts.get(t.decl.step_id)]
    for c in t.calls:
        sid = c.decl.step_id
        sig += (attempts.get(sid), requests.get(sid) if requests is not None else None, by_step.get(sid))
    return tuple(sig)


def same(a: Signature, b: Signature) -> bool:
    """``a`` and ``b`` hold the same objects (identity), or equal ones."""
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


class ContextMemo:
    """The earlier turns' groups of each agent step of one run, kept between its turns (see the module docstring).

    Not thread-safe; one per drive. Memory: one group per earlier turn of each agent step seen.

    Args:
        facts: the executor's token/hash memo (:class:`~shared.core.planning.TextFacts`).
    """

    def __init__(self, facts: TextFacts) -> None:
        self.facts = facts
        self._kept: dict[StepId, list[TurnGroup]] = {}
        self.rebuilt = 0  # earlier turns rebuilt so far (for tests and benchmarks)

    def plan(self, state: RunState, branch_id: BranchId, agent: StepId, turn: int,
             outcomes: Sequence[Outcome] = ()) -> TurnPlan:
        """Which earlier turns of turn ``turn`` are kept and which to rebuild (``outcomes``: call outcomes about
        to be committed with the turn's intent). O(earlier turns) look-ups, no text."""
        branch = state.branches[branch_id]
        by_step: dict[str, Outcome] = {o.step_id: o for o in outcomes}
        rec = agentfold.record(branch, agent)
        kept = self._kept.get(agent, [])
        groups: list[TurnGroup | None] = []
        stale: list[tuple[int, EarlierTurn, Signature]] = []
        refs: dict[str, BlobRef] = {}
        for i, t in enumerate(rec.turns[:turn - 1] if rec is not None else ()):
            sig = signature(branch, t, by_step)
            if i < len(kept) and same(kept[i].signature, sig):
                groups.append(kept[i])
                continue
            earlier = earlier_turn(branch, t)
            groups.append(None)
            stale.append((i, earlier, sig))
            refs.update((r.sha256, r) for r in turn_refs(branch, earlier, by_step))
        return TurnPlan(branch_id=branch_id, agent=agent, turn=turn, groups=tuple(groups), stale=tuple(stale),
                        refs=tuple(refs.values()))

    def build(self, plan: TurnPlan, state: RunState, action: DispatchTurn, agent: AgentStep, spec: WorkflowSpec, *,
              run_outputs: Mapping[str, str], blobs: Mapping[str, bytes],
              outcomes: Sequence[Outcome] = ()) -> TurnContext:
        """The context :func:`~shared.core.agentcontext.build_turn` makes for ``action`` (same arguments; ``blobs``
        needs only ``plan.refs``), from the kept groups and the stale ones rebuilt (then kept).

        Raises:
            KeyError: a blob of ``plan.refs`` is missing from ``blobs``.
        """
        branch = state.branches[plan.branch_id]
        by_step: dict[str, Outcome] = {o.step_id: o for o in outcomes}
        groups = list(plan.groups)
        for i, earlier, sig in plan.stale:
            made = tuple(group_items(branch, earlier, blobs=blobs, by_step=by_step))
            groups[i] = TurnGroup(signature=sig, items=made, candidates=tuple(turn_candidates(made, self.facts)),
                                  messages=tuple(item_message(it) for it in made))
        self.rebuilt += len(plan.stale)
        done = [g for g in groups if g is not None]
        assert len(done) == len(groups)
        self._keep(plan.agent, done)
        head = head_items(agent, run_outputs)
        items = [*head, *(it for g in done for it in g.items)]
        packed = pack([*turn_candidates(head, self.facts), *(c for g in done for c in g.candidates)],
                      policy_for(agent, spec))
        ids = packed.partition.packed
        head_ids = {h.id for h in head}
        n_head = sum(1 for p in ids[:len(head)] if p in head_ids)  # head items come first: a prefix of ``ids``
        messages = list(turn_messages(head, ids[:n_head]))
        if len(ids) == len(items):  # everything packed
            messages += (m for g in done for m in g.messages)
        else:
            chosen = set(ids[n_head:])
            messages += (m for g in done for it, m in zip(g.items, g.messages, strict=True) if it.id in chosen)
        request = chat_request(agent.model, run_id=state.run_id, step_id=action.step_id, messages=messages,
                               tools=tool_schemas(agent), attempt=action.attempt, turn=action.turn)
        return TurnContext(items=tuple(items), packed=packed, request=request)

    def _keep(self, agent: StepId, groups: list[TurnGroup]) -> None:
        """Keep ``groups`` as the agent's first earlier turns (any kept beyond them stay: signatures decide)."""
        kept = self._kept.get(agent, [])
        self._kept[agent] = groups + kept[len(groups):]
