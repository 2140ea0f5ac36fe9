"""Honest outcomes: a context check is reported beside the outcome, never as it."""

from __future__ import annotations

import msgspec
import pytest

from reel.shared.core.run.events import Verdict, VerdictStatus
from reel.shared.core.run.ids import LSN, BranchId, RunId
from reel.shared.core.run.persistent import FrozenMap
from reel.shared.core.run.state import RunState
from reel.shared.core.verify.verification import (
    UNLABELLED,
    check_verdicts,
    checks_summary,
    context_checks,
    reported_outcome,
)
from tests.golden.regen import GOLDEN_DIR, fold_log

CHECK = "task-in-final-context"


@pytest.fixture(scope="module")
def completed() -> RunState:
    state, _ = fold_log(GOLDEN_DIR / "hand_recovery.jsonl")
    assert state.status == "completed" and state.verifying_lsn is not None
    return state


def _judged(base: RunState, logged: str, labels: dict[str, str], verdicts: dict[str, VerdictStatus]) -> RunState:
    """``base`` completed with ``logged`` as its committed outcome and these verdicts at its snapshot."""
    branch, lsn = base.verifying_branch or BranchId("main"), base.verifying_lsn or LSN(1)
    made = tuple(Verdict(run_id=RunId(base.run_id), branch_id=branch, snapshot_lsn=lsn, verifier=name, status=status,
                         reason="", at_ms=1) for name, status in verdicts.items())
    return msgspec.structs.replace(base, labels=FrozenMap.of(labels), verifiers=tuple(verdicts), verdicts=made,
                                   outcome=logged)  # type: ignore[arg-type]


@pytest.mark.parametrize(("labels", "verdicts", "logged", "reported"), [
    ({}, {CHECK: "pass"}, "passed", "passed"),  # a live run's own context_requires: as committed
    ({"context_checks": CHECK}, {CHECK: "pass"}, "passed", UNLABELLED),  # an unlabelled recording
    ({"context_checks": CHECK}, {CHECK: "fail"}, "failed", UNLABELLED),  # the check failed: its own column
    ({"context_checks": CHECK}, {"recorded_outcome": "fail", CHECK: "pass"}, "failed", "failed"),
    ({"context_checks": CHECK}, {"recorded_outcome": "pass", CHECK: "fail"}, "failed", "passed"),
    ({"context_checks": ""}, {}, "succeeded", UNLABELLED),  # a replay with no verifier at all
    ({"replayed_from": "x.traj"}, {CHECK: "pass"}, "passed", UNLABELLED),  # replayed before the label
])
def test_reported_outcome(completed: RunState, labels: dict[str, str], verdicts: dict[str, VerdictStatus],
                          logged: str, reported: str) -> None:
    state = _judged(completed, logged, labels, verdicts)
    assert reported_outcome(state) == reported
    expected = [n for n in verdicts if n == CHECK and labels]
    assert list(context_checks(state)) == expected
    assert [v.verifier for v in check_verdicts(state)] == expected
    assert checks_summary(state) == ", ".join(f"{n}={verdicts[n]}" for n in expected)


def test_a_run_not_completed_has_no_outcome(completed: RunState) -> None:
    state = msgspec.structs.replace(_judged(completed, "passed", {"context_checks": CHECK}, {CHECK: "pass"}),
                                    outcome=None)
    assert reported_outcome(state) is None and checks_summary(state) == f"{CHECK}=pass"
