"""Fork's pure checks: the edits of a fork (a rewind at an agent turn with edits) against the turn they edit.

A fork re-runs turn ``at_step`` of an agent on a new branch (exactly as ``rewind --at-step`` does,
:func:`reel.shared.core.mutators.rewind.decide`) with edits to its context
(:mod:`reel.shared.core.run.forkedits`). What the parent branch recorded for that turn decides which
edits make sense: its last attempt's partition names every candidate item, so

* ``restore`` takes an item the turn left ``available`` or ``dropped`` (a packed one is refused: nothing
  would change);
* ``drop`` takes an item of the candidate set not dropped already;
* ``tool_result`` takes a call of an earlier turn of the same agent;
* ``param`` takes a body field Reel does not set itself (:data:`RESERVED_PARAMS`); ``model`` a non-empty name.

A turn never dispatched on the parent (no partition recorded) takes no ``restore``/``drop``. The texts of
``instructions`` and ``tool_result`` are recorded inline on the ``branch_forked``: each is at most
:data:`MAX_EDIT_TEXT_BYTES`.
"""

from __future__ import annotations

from collections.abc import Sequence

from reel.shared.core.agent import turnfold
from reel.shared.core.errors import InvalidCommand
from reel.shared.core.run.eventfields import ContextPartition
from reel.shared.core.run.forkedits import ContextEdit, Drop, Instructions, Model, Param, Restore, ToolResult
from reel.shared.core.run.ids import ContextItemId, RunId, StepId
from reel.shared.core.run.state import BranchState
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.workflow.modelspec import RESERVED_PARAMS

MAX_EDIT_TEXT_BYTES = 64 * 1024
"""Bytes of one edit's text (new instructions, a replaced tool result), UTF-8."""


class InvalidEdit(InvalidCommand):
    """A fork edit that does not fit the turn it edits (an unknown item, a call of a later turn, …)."""

    code = "invalid_edit"


def recorded_partition(branch: BranchState, turn: StepId) -> ContextPartition | None:
    """The partition of the last attempt of ``turn`` on ``branch`` that recorded one (``None``: never packed)."""
    for a in reversed(branch.attempts.get(turn, ())):
        if a.context is not None:
            return a.context
    return None


def check_edits(run_id: RunId, branch: BranchState, at_step: StepId | None, edits: Sequence[ContextEdit]) -> None:
    """Refuse ``edits`` that do not fit turn ``at_step`` of ``branch`` (see the module docstring).

    Raises:
        InvalidEdit: the first edit that does not fit, or ``at_step`` is not an agent turn.
    """
    parsed = parse_step_id(at_step) if at_step is not None else None
    if at_step is None or parsed is None or parsed[2] >= 0:
        raise InvalidEdit(f"fork edits apply to an agent turn (e.g. fix:t1), not {at_step!r}", run_id=run_id)
    part = recorded_partition(branch, at_step)
    seen: set[ContextItemId] = set()
    for e in edits:
        if isinstance(e, Instructions | ToolResult) and len(e.text.encode()) > MAX_EDIT_TEXT_BYTES:
            raise InvalidEdit(f"{e.__struct_config__.tag} text is {len(e.text.encode())} bytes, over the"
                              f" {MAX_EDIT_TEXT_BYTES} an edit carries", run_id=run_id)
        if isinstance(e, Restore | Drop):
            if e.item in seen:
                raise InvalidEdit(f"item {e.item!r} is edited twice", run_id=run_id)
            seen.add(e.item)
            _check_item(run_id, at_step, part, e)
        elif isinstance(e, ToolResult):
            _check_call(run_id, branch, parsed, e.call)
        elif isinstance(e, Param) and (not e.key or e.key in RESERVED_PARAMS):
            raise InvalidEdit(f"param {e.key!r} cannot be set (Reel sets {', '.join(RESERVED_PARAMS)})",
                              run_id=run_id)
        elif isinstance(e, Model) and not e.name:
            raise InvalidEdit("model edit needs a name", run_id=run_id)


def _check_item(run_id: RunId, turn: StepId, part: ContextPartition | None, e: Restore | Drop) -> None:
    if part is None:
        raise InvalidEdit(f"turn {turn} recorded no context partition on this branch: its items are unknown",
                          run_id=run_id)
    every = (*part.packed, *part.available, *part.dropped)
    if e.item not in every:
        raise InvalidEdit(f"turn {turn} has no context item {e.item!r} (items: {', '.join(every)})", run_id=run_id)
    if isinstance(e, Restore) and e.item in part.packed:
        raise InvalidEdit(f"item {e.item!r} was packed in turn {turn} already; restore takes an available or"
                          f" dropped item", run_id=run_id)
    if isinstance(e, Drop) and e.item in part.dropped:
        raise InvalidEdit(f"item {e.item!r} was dropped in turn {turn} already", run_id=run_id)


def _check_call(run_id: RunId, branch: BranchState, turn: tuple[StepId, int, int], call: StepId) -> None:
    parsed = parse_step_id(call)
    agent, t, _ = turn
    if parsed is None or parsed[2] < 0 or parsed[0] != agent or parsed[1] >= t:
        raise InvalidEdit(f"tool result {call!r} is not a call of an earlier turn of {agent} (before turn {t})",
                          run_id=run_id)
    if turnfold.declared(branch, call) is None:
        raise InvalidEdit(f"call {call!r} was never declared on this branch", run_id=run_id)
