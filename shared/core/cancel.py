"""Cancel's pure core: whether a :class:`~shared.core.commands.CancelRun` cancels the run (brief §2, §3).

Cancelling is legal from ``pending``, ``running`` and ``verifying`` (:data:`~shared.core.fold.LIVE`);
a run that already ended is left as it is (:class:`NoOp`: the caller's intent, "not running",
holds already). No clock, I/O or randomness: the time comes in as an argument.
"""

from __future__ import annotations

import msgspec

from shared.core.commands import CancelRun
from shared.core.events import RunCancelled
from shared.core.fold import LIVE, RunState


class NoOp(msgspec.Struct, frozen=True, kw_only=True):
    """Nothing to commit: the run already ended."""

    reason: str


def decide(state: RunState, cmd: CancelRun, *, at_ms: int) -> RunCancelled | NoOp:
    """Pure: the event cancelling ``state`` (at ``at_ms``, epoch ms), or why there is nothing to do."""
    if state.status in LIVE:
        return RunCancelled(reason=cmd.reason, at_ms=at_ms)
    return NoOp(reason=f"run is already {state.status}")
