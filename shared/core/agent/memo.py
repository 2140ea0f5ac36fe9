"""Incremental agent-turn contexts: a turn's packing cost grows with what is new and what is packed, not with the
number of earlier turns.

:func:`reel.shared.core.agent.turncontext.build_turn` rebuilds turn *t*'s candidates from every
earlier turn — reading their blobs, decoding answers, counting tokens — so an agent's
*t*-th turn costs O(t) of that work and a run of T turns O(T²). Yet an earlier turn's
items (its assistant message and its tool results, :func:`~reel.shared.core.agent.turncontext.group_items`)
are a pure function of a few objects of the folded state: its
:class:`~reel.shared.core.agent.turnstate.TurnRecord`, the attempts of the turn and of each of its
calls, each call's input request, and the outcome about to be committed with the intent
(if any). :class:`ContextMemo` keeps, per agent step, each earlier turn's items together
with those objects (its *signature*), their packer candidates and their transcript messages.
A turn compares each earlier turn's signature with the one kept — by identity first (the fold
shares every unchanged object between states), by value otherwise — and rebuilds only the
turns whose signature differs: the newest turn, once; every turn after a rewind onto a branch
whose records are not shared, or after a drive starts. Reading a signature is a few dict
look-ups per turn; everything that depends on text is done once per turn and kept.

Then :func:`~reel.shared.core.pack.packer.pack_groups` partitions the head items (instructions, context
items) and each kept turn as one unit — its packer facts kept with it — in O(head + turns), with no
ranking when everything fits, and the transcript is the kept messages of the packed turns. What
is left growing with the run is a few look-ups per earlier turn (≈ 2 µs each) and what the
partition and the prompt hold. A cache of a pure function keyed by all of its inputs: the context is the one a
full rebuild makes, byte for byte (tests/unit/test_agent_memo.py and
tests/integration/test_agent_incremental.py compare them on every turn).

Two passes keep this pure, like :mod:`reel.shared.core.agent.turncontext`: :meth:`ContextMemo.plan`
says which blobs the stale turns need, :meth:`ContextMemo.build` makes the context from
their bodies. No I/O; the executor holds one memo per drive (services/executor/agent.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.agent.actions import DispatchTurn
from reel.shared.core.agent.forkcontext import TurnEdits, edited_items, pack_edited
from reel.shared.core.agent.turncontext import (
    EarlierTurn,
    TurnContext,
    TurnItem,
    earlier_turn,
    group_items,
    head_items,
    item_message,
    result_max_tokens,
    tool_schemas,
    turn_candidates,
    turn_messages,
    turn_policy,
    turn_refs,
    with_trimmed,
)
from reel.shared.core.agent.turnstate import TurnRecord
from reel.shared.core.chat.messages import ChatMessage, chat_request
from reel.shared.core.pack.packer import Candidate, GroupFacts, PackPolicy, accounted, group_facts, pack_groups
from reel.shared.core.run.events import AttemptEnd, BlobRef
from reel.shared.core.run.ids import BranchId, StepId
from reel.shared.core.run.planning import TextFacts
from reel.shared.core.run.state import BranchState, RunState
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec


class Signature(msgspec.Struct, frozen=True, gc=False):
    """Every object of the state one earlier turn's items derive from (:func:`signature`): its record, and per
    step of it (the turn, then each call: ``steps``) its attempts, its input request and the outcome pending
    with the intent (``None`` for a branch with no requests / no outcome pending). Equal signatures, equal items."""

    turn: TurnRecord
    steps: tuple[StepId, ...]
    attempts: tuple[object, ...]
    requests: tuple[object, ...] | None
    pending: tuple[object, ...] | None


@dataclass(slots=True)
class TurnGroup:
    """One earlier turn as the context uses it: its items, their candidates and messages (same order), and its
    packer facts under the policy last used (``facts``)."""

    signature: Signature
    items: tuple[TurnItem, ...]
    candidates: tuple[Candidate, ...]
    messages: tuple[ChatMessage, ...]
    facts: tuple[PackPolicy, GroupFacts] | None = None

    def facts_for(self, policy: PackPolicy) -> GroupFacts:
        """The group's packer facts under ``policy`` (computed once per policy)."""
        if self.facts is None or self.facts[0] != policy:
            self.facts = policy, group_facts(self.candidates, policy)
        return self.facts[1]


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


def signature(branch: BranchState, t: TurnRecord, by_step: Mapping[str, AttemptEnd]) -> Signature:
    """The signature of the earlier turn ``t`` on ``branch`` (``by_step``: outcomes pending, by step id)."""
    steps = (t.decl.step_id, *(c.decl.step_id for c in t.calls))
    return Signature(t, steps, tuple(map(branch.attempts.get, steps)), _asked(branch, steps), _pending(by_step, steps))


def _asked(branch: BranchState, steps: tuple[StepId, ...]) -> tuple[object, ...] | None:
    if branch.requests is msgspec.UNSET:
        return None
    asked = tuple(map(branch.requests.get, steps))
    return None if asked.count(None) == len(asked) else asked


def _pending(by_step: Mapping[str, AttemptEnd], steps: tuple[StepId, ...]) -> tuple[object, ...] | None:
    if not by_step:
        return None
    pending = tuple(map(by_step.get, steps))
    return None if pending.count(None) == len(pending) else pending


def unchanged(kept: Signature, branch: BranchState, t: TurnRecord, by_step: Mapping[str, AttemptEnd]) -> bool:
    """The earlier turn ``t`` on ``branch`` has the signature ``kept``: the same objects, or equal ones (tuples
    compare by identity first). A few look-ups, no text."""
    steps = kept.steps
    return (kept.turn is t or kept.turn == t) and kept.attempts == tuple(map(branch.attempts.get, steps)) \
        and kept.requests == _asked(branch, steps) and kept.pending == _pending(by_step, steps)


class ContextMemo:
    """The earlier turns' groups of each agent step of one run, kept between its turns (see the module docstring).

    Not thread-safe; one per drive. Memory: one group per earlier turn of each agent step seen.

    Args:
        facts: the executor's token/hash memo (:class:`~reel.shared.core.run.planning.TextFacts`).
    """

    def __init__(self, facts: TextFacts) -> None:
        self.facts = facts
        self._kept: dict[StepId, list[TurnGroup]] = {}
        self.rebuilt = 0  # earlier turns rebuilt so far (for tests and benchmarks)

    def plan(self, state: RunState, branch_id: BranchId, agent: StepId, turn: int,
             outcomes: Sequence[AttemptEnd] = ()) -> TurnPlan:
        """Which earlier turns of turn ``turn`` are kept and which to rebuild (``outcomes``: call outcomes about
        to be committed with the turn's intent). O(earlier turns) look-ups, no text."""
        branch = state.branches[branch_id]
        by_step: dict[str, AttemptEnd] = {o.step_id: o for o in outcomes}
        rec = turnfold.record(branch, agent)
        kept = self._kept.get(agent, [])
        groups: list[TurnGroup | None] = []
        stale: list[tuple[int, EarlierTurn, Signature]] = []
        refs: dict[str, BlobRef] = {}
        for i, t in enumerate(rec.turns[:turn - 1] if rec is not None else ()):
            old = kept[i] if i < len(kept) else None
            if old is not None and unchanged(old.signature, branch, t, by_step):
                groups.append(old)
                continue
            earlier = earlier_turn(branch, t)
            groups.append(None)
            stale.append((i, earlier, signature(branch, t, by_step)))
            refs.update((r.sha256, r) for r in turn_refs(branch, earlier, by_step))
        return TurnPlan(branch_id=branch_id, agent=agent, turn=turn, groups=tuple(groups), stale=tuple(stale),
                        refs=tuple(refs.values()))

    def build(self, plan: TurnPlan, state: RunState, action: DispatchTurn, agent: AgentStep, spec: WorkflowSpec, *,
              run_outputs: Mapping[str, str], blobs: Mapping[str, bytes],
              outcomes: Sequence[AttemptEnd] = (), edits: TurnEdits | None = None) -> TurnContext:
        """The context :func:`~reel.shared.core.agent.turncontext.build_turn` makes for ``action`` (same arguments;
            ``blobs``
        needs only ``plan.refs``), from the kept groups and the stale ones rebuilt (then kept). ``agent`` is the
        spec the turn runs with (:func:`~reel.shared.core.agent.forkcontext.edited_agent`); ``edits`` that touch its
        items (a fork's restores, drops, tool results) pack every candidate afresh with them
        (:func:`~reel.shared.core.agent.forkcontext.pack_edited`): the kept groups stay as they were.

        Raises:
            KeyError: a blob of ``plan.refs`` is missing from ``blobs``.
        """
        branch = state.branches[plan.branch_id]
        by_step: dict[str, AttemptEnd] = {o.step_id: o for o in outcomes}
        policy, reserved, budget = turn_policy(agent, spec, self.facts)
        fit = (result_max_tokens(policy), self.facts)  # the same for every turn of the agent: kept groups stay right
        groups = list(plan.groups)
        for i, earlier, sig in plan.stale:
            made = tuple(group_items(branch, earlier, blobs=blobs, by_step=by_step, fit=fit))
            groups[i] = TurnGroup(signature=sig, items=made, candidates=tuple(turn_candidates(made, self.facts)),
                                  messages=tuple(item_message(it) for it in made))
        self.rebuilt += len(plan.stale)
        done = [g for g in groups if g is not None]
        assert len(done) == len(groups)
        self._keep(plan.agent, done)
        head = head_items(agent, run_outputs)
        if edits is not None and edits.touches_items:
            return self._edited(state, action, agent, [*head, *chain.from_iterable(g.items for g in done)], policy,
                                (reserved, budget), edits)
        items = (*head, *chain.from_iterable(g.items for g in done))
        packed = with_trimmed(accounted(pack_groups(turn_candidates(head, self.facts),
                                                    [g.facts_for(policy) for g in done], policy),
                                        reserved, self.facts.counter.name, budget), items)
        ids = packed.partition.packed
        head_ids = {h.id for h in head}
        n_head = sum(1 for p in ids[:len(head)] if p in head_ids)  # head items come first: a prefix of ``ids``
        messages = list(turn_messages(head, ids[:n_head]))
        chosen = set(ids[n_head:]) if len(ids) - n_head < sum(len(g.items) for g in done) else None
        for g in done:  # a group is packed whole or not at all
            if g.items and (chosen is None or g.items[0].id in chosen):
                messages += g.messages
        request = chat_request(agent.model, run_id=state.run_id, step_id=action.step_id, messages=messages,
                               tools=tool_schemas(agent), attempt=action.attempt, turn=action.turn)
        return TurnContext(items=items, packed=packed, request=request)

    def _edited(self, state: RunState, action: DispatchTurn, agent: AgentStep, items: list[TurnItem],
                policy: PackPolicy, budget: tuple[int, int], edits: TurnEdits) -> TurnContext:
        """The context of a turn a fork edited: every candidate packed afresh with the edits."""
        items = edited_items(items, edits)
        reserved, whole = budget
        packed = with_trimmed(accounted(pack_edited(turn_candidates(items, self.facts), policy, edits), reserved,
                                        self.facts.counter.name, whole), items)
        request = chat_request(agent.model, run_id=state.run_id, step_id=action.step_id,
                               messages=turn_messages(items, packed.partition.packed), tools=tool_schemas(agent),
                               attempt=action.attempt, turn=action.turn)
        return TurnContext(items=tuple(items), packed=packed, request=request)

    def _keep(self, agent: StepId, groups: list[TurnGroup]) -> None:
        """Keep ``groups`` as the agent's first earlier turns (any kept beyond them stay: signatures decide)."""
        kept = self._kept.get(agent, [])
        self._kept[agent] = groups + kept[len(groups):]
