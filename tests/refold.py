"""Helpers the tests (and anyone checking a materialized state) use.

:func:`assert_refold_identical` is the fold's invariant: any materialized state
must equal a cold re-fold of the log.
"""

from __future__ import annotations

from reel.shared.core.run.state import RunState
from reel.shared.core.run.statecodec import STATE_ENCODER
from reel.shared.nats.eventlog import JetStreamEventLog

_enc = STATE_ENCODER


async def assert_refold_identical(log: JetStreamEventLog, state: RunState) -> RunState:
    """Re-fold ``state.run_id`` from the log up to ``state.head_lsn`` and assert byte equality.

    Returns the re-folded state.

    Raises:
        AssertionError: the encodings differ (the message shows the first differing byte).
    """
    cold = await log.load(state.run_id, upto_lsn=state.head_lsn, cold=True)
    a, b = _enc.encode(state), _enc.encode(cold)
    if a != b:
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        raise AssertionError(
            f"materialized state differs from a cold re-fold of {state.run_id} at byte {i}: "
            f"{a[max(0, i - 80):i + 80]!r} != {b[max(0, i - 80):i + 80]!r}"
        )
    return cold
