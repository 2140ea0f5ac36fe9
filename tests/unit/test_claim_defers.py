"""A claim defers to a live owner with an attempt in flight (a duplicate start or resume delivered to
a second executor must not supersede the live owner's attempt), on every prefix of every golden log; checked
against recovery's own list of open intents (``shared.core.recovery.open_intents``), an independent scan."""

from __future__ import annotations

from collections import Counter

from shared.core import planning as plan
from shared.core.fold import apply_commit
from shared.core.recovery import open_intents
from tests.golden.regen import logs, read_log


def test_a_claim_defers_exactly_when_a_live_owner_has_an_attempt_in_flight() -> None:
    seen: Counter[str] = Counter()
    for path in logs():
        state = None
        for lsn, commit in read_log(path):
            state = apply_commit(state, lsn, commit)
            owner = state.executor_id
            in_flight = bool(open_intents(state))
            if owner is None:
                assert not plan.claim_defers(state, "x-other", owner_alive=True)
                continue
            assert not plan.claim_defers(state, owner, owner_alive=True), "an owner never defers to itself"
            assert not plan.claim_defers(state, "x-other", owner_alive=False), "a dead owner is taken over"
            assert plan.claim_defers(state, "x-other", owner_alive=True) == in_flight, (path.name, lsn)
            seen["defers" if in_flight else "claims"] += 1
    assert seen["defers"] > 0 and seen["claims"] > 0, seen  # both cases occur in the golden logs
