"""Fork edits: what a fork changes in the context of the turn it re-runs (docs/forks.md).

A fork is a rewind at an agent turn that carries edits (``branch_forked.edits``). Each edit is a tagged
struct (``edit`` names it) and travels in the log as part of the event that creates the branch, so the log
says what the fork changed:

==================  =======================================================  ===========================
edit                what it does                                             applies to
==================  =======================================================  ===========================
``restore``         pack a candidate item the turn left ``available`` or     the forked turn
                    ``dropped`` (with its turn group)
``drop``            leave out a candidate item (with its turn group)         the forked turn
``instructions``    replace the agent's instructions                         the forked turn and later
``model``           send the requests to another model name                  the forked turn and later
``param``           set one extra request-body field (``temperature`` …)     the forked turn and later
``tool_result``     replace an earlier call's result the model reads         the forked turn and later
==================  =======================================================  ===========================

Events created before edits existed carry none (the field is unset, not encoded): old logs fold unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from reel.shared.core.run.ids import LSN, ContextItemId, StepId
from reel.shared.core.run.stepids import cutoff_key, order_key


class ForkEdit(msgspec.Struct, frozen=True, kw_only=True, tag_field="edit"):
    """Base of the fork edits (the ``edit`` field names the kind)."""


class Restore(ForkEdit, frozen=True, kw_only=True, tag="restore"):
    """Pack ``item`` (a candidate the turn left available or dropped) whatever the policy and the budget."""

    item: ContextItemId


class Drop(ForkEdit, frozen=True, kw_only=True, tag="drop"):
    """Leave ``item`` out of the turn's prompt (recorded dropped, reason ``dropped_by_fork``)."""

    item: ContextItemId


class Instructions(ForkEdit, frozen=True, kw_only=True, tag="instructions"):
    """The agent's instructions from the forked turn on."""

    text: str


class Model(ForkEdit, frozen=True, kw_only=True, tag="model"):
    """The model name the requests carry from the forked turn on (the spec's ``model``)."""

    name: str


class Param(ForkEdit, frozen=True, kw_only=True, tag="param"):
    """One extra request-body field (the spec's ``params[key]``) from the forked turn on."""

    key: str
    value: Any


class ToolResult(ForkEdit, frozen=True, kw_only=True, tag="tool_result"):
    """What the model reads as the result of the earlier call ``call`` (its step id, ``fix:t1:c1``) from the
    forked turn on (a success's text)."""

    call: StepId
    text: str


ContextEdit = Restore | Drop | Instructions | Model | Param | ToolResult
"""One fork edit (the union on the wire)."""


def describe(edit: ContextEdit) -> str:
    """One edit in a few words, as ``reel compare`` and the UI show it (texts by their length, never whole)."""
    match edit:
        case Restore(item=item):
            return f"restore {item}"
        case Drop(item=item):
            return f"drop {item}"
        case Instructions(text=text):
            return f"instructions ({len(text)} chars)"
        case Model(name=name):
            return f"model {name}"
        case Param(key=key, value=value):
            return f"param {key}={msgspec.json.encode(value).decode()}"
        case ToolResult(call=call, text=text):
            return f"tool result {call} ({len(text)} chars)"
    return edit.__class__.__name__


class BranchEdits(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Edits in force on a branch, made by the fork that created it (``own``) or by an ancestor's fork the
    branch continues from (inherited: only their lasting edits count there).

    Attributes:
        at_step: the turn the edits were made for (``fix:t2``): they apply from it on.
        edits: as the fork command gave them.
        own: made by this branch's own fork (its restores and drops apply to ``at_step``).
    """

    at_step: StepId
    edits: tuple[ContextEdit, ...]
    own: bool = True


def carried(positions: Mapping[StepId, int], parent: tuple[BranchEdits, ...], parent_created_lsn: LSN,
            fork_lsn: LSN, from_step: StepId | None, own: tuple[ContextEdit, ...]) -> tuple[BranchEdits, ...]:
    """The edits in force on a branch forked from a parent holding ``parent``: the parent's edits the fork
    continues from (it forks in the parent's own records, at or after the turn they were made for), marked
    inherited, then its own (``own``, made for ``from_step``).

    Args:
        positions: workflow step id → index (for :func:`~reel.shared.core.run.stepids.order_key`).
    """
    cutoff = cutoff_key(positions, from_step)
    kept = tuple(msgspec.structs.replace(e, own=False) for e in parent
                 if fork_lsn >= parent_created_lsn and order_key(positions, e.at_step) <= cutoff)
    if own and from_step is not None:
        kept += (BranchEdits(at_step=from_step, edits=own),)
    return kept
