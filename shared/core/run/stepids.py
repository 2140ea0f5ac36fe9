"""Step ids of agent turns and tool calls: pure functions of the log.

A workflow step of ``kind: agent`` with id ``solve`` has *dynamic* steps, declared in
the log as the loop runs (``steps_declared``):

=================  ======================  ==========================================
what               step id                 context item ids (for later turns)
=================  ======================  ==========================================
turn *t*           ``solve:t<t>``          ``solve:t<t>:msg`` (the assistant message)
tool call *i*      ``solve:t<t>:c<i>``     ``solve:t<t>:c<i>:obs`` (the tool result)
=================  ======================  ==========================================

``t`` counts from 1, ``i`` from 0 (the call's position in the model's ``tool_calls``).
``:`` is outside user step ids (``[A-Za-z0-9_-]``), so a dynamic id never collides
with a workflow step; it is legal in a NATS subject token. KV keys do not allow
``:``, so :func:`kv_safe` maps it to ``=`` (also outside user ids: injective and
reversible) wherever a key embeds a step id (:func:`reel.shared.core.wire.subjects.outcome_key`).

Ordering of steps (fork inheritance, listings): :func:`order_key` ``(workflow index,
turn, call)`` with a static step at ``(i, 0, -1)``, a turn at ``(i, t, -1)`` and a
call at ``(i, t, c)``: an agent's dynamic steps sort after the agent itself, in
declaration order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from reel.shared.core.run.ids import ContextItemId, StepId

_DYNAMIC = re.compile(r"^([A-Za-z0-9_-]{1,128}):t([1-9][0-9]{0,5})(?::c(0|[1-9][0-9]{0,5}))?$")


def turn_step_id(agent: str, turn: int) -> StepId:
    """``<agent>:t<turn>`` (turn ≥ 1)."""
    return StepId(f"{agent}:t{turn}")


def call_step_id(agent: str, turn: int, index: int) -> StepId:
    """``<agent>:t<turn>:c<index>`` (index ≥ 0: position in the turn's tool calls)."""
    return StepId(f"{agent}:t{turn}:c{index}")


def message_item_id(turn_step: str) -> ContextItemId:
    """Context item id of a turn's assistant message: ``<turn step>:msg``."""
    return ContextItemId(f"{turn_step}:msg")


def observation_item_id(call_step: str) -> ContextItemId:
    """Context item id of a tool call's result: ``<call step>:obs``."""
    return ContextItemId(f"{call_step}:obs")


def parse_step_id(step_id: str) -> tuple[StepId, int, int] | None:
    """``(agent, turn, call)`` of a dynamic step id (``call`` is -1 for a turn), else ``None``."""
    m = _DYNAMIC.match(step_id)
    if m is None:
        return None
    return StepId(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) is not None else -1


def order_key(positions: Mapping[StepId, int], step_id: StepId) -> tuple[int, int, int]:
    """Sort key of any step id: ``(workflow index, turn, call)`` (see the module docstring).

    Args:
        positions: workflow step id → index.

    Raises:
        KeyError: neither a workflow step nor a dynamic step of one.
    """
    parsed = parse_step_id(step_id)
    if parsed is None:
        return positions[step_id], 0, -1
    agent, turn, call = parsed
    return positions[agent], turn, call


NO_CUTOFF = (1 << 62, 0, 0)
"""The cutoff key of a fork without ``from_step``: every step is before it."""


def cutoff_key(positions: Mapping[StepId, int], from_step: StepId | None) -> tuple[int, int, int]:
    """The order key a fork keeps the steps strictly before (:data:`NO_CUTOFF` without ``from_step``)."""
    return NO_CUTOFF if from_step is None else order_key(positions, from_step)


def kv_safe(step_id: str) -> str:
    """``step_id`` with ``:`` mapped to ``=`` (KV keys allow ``[-/_=.a-zA-Z0-9]``); identity for workflow ids."""
    return step_id.replace(":", "=")
