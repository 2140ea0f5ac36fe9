"""Planning from a cursor (O(1) per step): ``next_action(state, …, start=succeeded_prefix(…))``
decides what a full scan decides, on every prefix of every golden log."""

from __future__ import annotations

from pathlib import Path

import pytest

from reel.shared.core.run import planning as plan
from reel.shared.core.run.fold import apply_commit
from reel.shared.core.run.state import StepStatus, step_statuses
from tests.golden.regen import logs, read_log


@pytest.mark.parametrize("path", logs(), ids=lambda p: p.name)
def test_the_cursor_plans_what_a_full_scan_plans(path: Path) -> None:
    state = None
    cursors: dict[str, int] = {}
    for lsn, commit in read_log(path):
        state = apply_commit(state, lsn, commit)
        bid = state.active_branch
        kept = plan.succeeded_prefix(state, bid, cursors.get(bid, 0))  # advanced commit by commit
        cursors[bid] = kept
        assert kept == plan.succeeded_prefix(state, bid)
        statuses = step_statuses(state, bid)
        assert all(s == StepStatus.SUCCEEDED for s in statuses[:kept])
        assert kept == len(statuses) or statuses[kept] != StepStatus.SUCCEEDED
        for executor in {state.executor_id or "x-none", "x-other"}:
            assert plan.next_action(state, executor, start=kept) == plan.next_action(state, executor)
