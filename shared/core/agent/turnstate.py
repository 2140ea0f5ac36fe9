"""The records the fold keeps per agent step and branch (``BranchState.agents``;
    :mod:`reel.shared.core.agent.turnfold`).

Frozen, like the rest of the folded state (:mod:`reel.shared.core.run.state`): a new turn or call
makes new records that share the unchanged ones. An agent's turns are a
:class:`~reel.shared.core.run.persistent.FrozenVector` (append and replace-the-last are O(log₃₂
turns)); a turn's calls a tuple (one model answer's tool calls).
"""

from __future__ import annotations

import msgspec

from reel.shared.core.run.events import AgentStatus, BlobRef, DeclaredStep
from reel.shared.core.run.ids import LSN, StepId
from reel.shared.core.run.persistent import FrozenVector


class Declared(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One declared tool call and the LSN of the commit that declared it."""

    decl: DeclaredStep
    lsn: LSN


class TurnRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One declared turn, the LSN that declared it, and its calls (declared with the turn's outcome)."""

    decl: DeclaredStep
    lsn: LSN
    calls: tuple[Declared, ...] = ()


class AgentOutcome(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How an agent loop ended (from :class:`~reel.shared.core.run.events.AgentFinished`, committed at ``lsn``)."""

    status: AgentStatus
    output_ref: BlobRef | None = None
    turns: int
    error_kind: str | None = None
    message: str = ""
    lsn: LSN
    at_ms: int


class AgentRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything declared for one agent step on one branch."""

    step_id: StepId
    turns: FrozenVector[TurnRecord] = FrozenVector()
    finished: AgentOutcome | None = None
