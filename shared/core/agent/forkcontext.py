"""A forked turn's context: the fork edits of a branch applied to one agent turn (docs/forks.md).

:func:`turn_edits` reads which edits are in force for turn ``<agent>:t<n>`` on a branch
(``BranchState.edits``, folded from ``branch_forked.edits``); then

* :func:`edited_agent` — the agent spec the turn runs with: its instructions and model changed;
* :func:`edited_items` — the turn's candidate items with replaced tool results;
* :func:`pack_edited` — the packer's partition with restored items packed (reason: the partition's
  ``restored``) and dropped ones left out (drop reason ``dropped_by_fork``). A restored or dropped item
  that belongs to a turn group (an earlier turn's message and results) takes its group along: the
  transcript stays valid. A restored item is packed whatever the policy and the budget.

Pure: no I/O; the executor calls these when it builds a turn (:mod:`reel.shared.core.agent.memo`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from reel.shared.core.agent.turncontext import TurnItem
from reel.shared.core.pack.packer import Candidate, Packed, PackPolicy, pack
from reel.shared.core.run.forkedits import Drop, Instructions, Model, Param, Restore, ToolResult
from reel.shared.core.run.ids import ContextItemId, StepId
from reel.shared.core.run.state import BranchState
from reel.shared.core.run.stepids import observation_item_id, parse_step_id
from reel.shared.core.workflow.spec import AgentStep

DROPPED_BY_FORK = "dropped_by_fork"
"""The drop reason of an item a fork left out."""


class TurnEdits(msgspec.Struct, frozen=True, kw_only=True):
    """The fork edits in force for one turn (see :func:`turn_edits`); empty fields change nothing."""

    restore: frozenset[ContextItemId] = frozenset()
    drop: frozenset[ContextItemId] = frozenset()
    instructions: str | None = None
    model: str | None = None
    params: Mapping[str, Any] = {}
    tool_results: Mapping[StepId, str] = {}

    @property
    def touches_items(self) -> bool:
        """The edits change the candidates or their packing (not only the agent's spec)."""
        return bool(self.restore or self.drop or self.tool_results)


def turn_edits(branch: BranchState, turn: StepId) -> TurnEdits | None:
    """The edits in force for ``turn`` (``<agent>:t<n>``) on ``branch``, ``None`` when there are none.

    The lasting edits (instructions, model, params, tool results) of every fork the branch descends from whose
    turn is of the same agent and not after ``turn`` apply, the later over the earlier; the restores and drops
    of the branch's own fork apply to its own fork turn only.
    """
    if not isinstance(branch.edits, tuple):
        return None
    parsed = parse_step_id(turn)
    if parsed is None or parsed[2] >= 0:
        return None
    restore: set[ContextItemId] = set()
    drop: set[ContextItemId] = set()
    fields: dict[str, Any] = {}
    params: dict[str, Any] = {}
    results: dict[StepId, str] = {}
    for made in branch.edits:
        at = parse_step_id(made.at_step)
        if at is None or at[0] != parsed[0] or at[1] > parsed[1]:
            continue
        for e in made.edits:
            if isinstance(e, Restore | Drop):
                if made.own and made.at_step == turn:
                    (restore if isinstance(e, Restore) else drop).add(e.item)
            elif isinstance(e, Instructions):
                fields["instructions"] = e.text
            elif isinstance(e, Model):
                fields["model"] = e.name
            elif isinstance(e, Param):
                params[e.key] = e.value
            elif isinstance(e, ToolResult):
                results[e.call] = e.text
    found = TurnEdits(restore=frozenset(restore), drop=frozenset(drop), params=params, tool_results=results,
                      **fields)
    return None if found == TurnEdits() else found


def edited_agent(agent: AgentStep, edits: TurnEdits | None) -> AgentStep:
    """``agent`` as the turn runs it: the edits' instructions, model name and params over the workflow's."""
    if edits is None:
        return agent
    model = agent.model
    if edits.model is not None:
        model = msgspec.structs.replace(model, model=edits.model)
    if edits.params:
        model = msgspec.structs.replace(model, params={**model.request_params, **edits.params})
    instructions = agent.instructions if edits.instructions is None else edits.instructions
    return msgspec.structs.replace(agent, model=model, instructions=instructions)


def edited_items(items: Sequence[TurnItem], edits: TurnEdits) -> list[TurnItem]:
    """``items`` with the tool results the edits replace (an edited result reads as a success)."""
    by_item = {observation_item_id(call): text for call, text in edits.tool_results.items()}
    return [msgspec.structs.replace(i, text=by_item[i.id], is_error=False, trimmed=False) if i.id in by_item else i
            for i in items]


def _with_groups(candidates: Sequence[Candidate], ids: frozenset[ContextItemId]) -> set[ContextItemId]:
    """``ids`` and every member of the groups they belong to."""
    groups = {c.group for c in candidates if c.id in ids and c.group is not None}
    return {c.id for c in candidates if c.id in ids or (c.group is not None and c.group in groups)}


def pack_edited(candidates: Sequence[Candidate], policy: PackPolicy, edits: TurnEdits) -> Packed:
    """:func:`~reel.shared.core.pack.packer.pack` with the edits' restores packed and drops left out (see the
    module docstring). The partition still covers every candidate once.

    Raises:
        ValueError: as :func:`~reel.shared.core.pack.packer.pack`.
    """
    dropped = _with_groups(candidates, edits.drop)
    restored = _with_groups(candidates, edits.restore) - dropped
    kept = [msgspec.structs.replace(c, required=True) if c.id in restored else c
            for c in candidates if c.id not in dropped]
    packed = pack(kept, policy)
    part = packed.partition
    gone = [c for c in candidates if c.id in dropped]
    if not gone and not restored:
        return packed
    reasons = (*(part.drop_reasons if isinstance(part.drop_reasons, tuple) else ()), *([DROPPED_BY_FORK] * len(gone)))
    tokens = part.item_tokens if isinstance(part.item_tokens, tuple) else ()
    partition = msgspec.structs.replace(
        part, dropped=(*part.dropped, *(c.id for c in gone)), drop_reasons=reasons or msgspec.UNSET,
        item_tokens=(*tokens, *(c.tokens for c in gone)),
        restored=tuple(i for i in part.packed if i in restored) or msgspec.UNSET)
    return msgspec.structs.replace(packed, partition=partition)
