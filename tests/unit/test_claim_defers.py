"""A claim defers to every live owner — with an attempt in flight or between two attempts — and to nobody else,
on every prefix of every golden log (a duplicate start or resume delivered to a second executor must never
supersede a live owner's attempt, nor dispatch one the owner is about to dispatch)."""

from __future__ import annotations

from collections import Counter

from reel.shared.core.mutators.recovery import open_intents
from reel.shared.core.run import planning as plan
from reel.shared.core.run.fold import apply_commit
from tests.golden.regen import logs, read_log


def test_a_claim_defers_exactly_when_the_owner_is_alive() -> None:
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
            assert plan.claim_defers(state, "x-other", owner_alive=True), (path.name, lsn)
            seen["in flight" if in_flight else "between attempts"] += 1
    assert seen["in flight"] > 0 and seen["between attempts"] > 0, seen  # both cases occur in the golden logs
