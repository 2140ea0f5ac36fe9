"""The records the fold keeps per agent step and branch (``BranchState.agents``; :mod:`shared.core.agentfold`)."""

from __future__ import annotations

import msgspec

from shared.core.events import AgentStatus, BlobRef, DeclaredStep
from shared.core.ids import LSN, StepId


class Declared(msgspec.Struct, kw_only=True):
    """One declared tool call and the LSN of the commit that declared it."""

    decl: DeclaredStep
    lsn: LSN


class TurnRecord(msgspec.Struct, kw_only=True):
    """One declared turn, the LSN that declared it, and its calls (declared with the turn's outcome)."""

    decl: DeclaredStep
    lsn: LSN
    calls: list[Declared] = []


class AgentOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How an agent loop ended (from :class:`~shared.core.events.AgentFinished`, committed at ``lsn``)."""

    status: AgentStatus
    output_ref: BlobRef | None = None
    turns: int
    error_kind: str | None = None
    message: str = ""
    lsn: LSN
    at_ms: int


class AgentRecord(msgspec.Struct, kw_only=True):
    """Everything declared for one agent step on one branch."""

    step_id: StepId
    turns: list[TurnRecord] = []
    finished: AgentOutcome | None = None
