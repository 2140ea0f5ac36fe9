"""Asking an executor to go on with a run another writer moved: a fork (rewind), an answer (respond), a
deadline's default (recovery) — one rule, :func:`reel.shared.core.mutators.rewind.needs_resume`, and one publish."""

from __future__ import annotations

from reel.shared.core.mutators import rewind
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.infra import Infra
from reel.shared.nats.leases import executor_alive
from reel.shared.nats.publish import publish_resume


async def resume_unless_driven(infra: Infra, names: Names, before: RunState, lsn: int) -> bool:
    """Publish ``ResumeRun`` for ``before``'s run unless its live owner drives it; True if published.

    Args:
        before: the run as it was decided on, before the commit at ``lsn`` (its status and owner decide).
        lsn: the commit that made the resume needed; the ``Nats-Msg-Id`` ``resume:<run>:<lsn>``, so a
            repeated publish within the stream's duplicate window is dropped.

    Raises:
        nats.errors.TimeoutError, nats.js.errors.APIError: the resume was not stored.
    """
    if not rewind.needs_resume(before, await executor_alive(infra.leases, before.executor_id)):
        return False
    await publish_resume(infra.js, names, before.run_id, lsn)
    return True
