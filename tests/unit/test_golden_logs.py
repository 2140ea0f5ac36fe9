"""Golden event logs replayed through today's codec and fold (STYLE habit 8; Temporal's replayer tests).

``tests/golden/*.jsonl`` are run logs as they sat in the stream — recorded through the
real executor (``record.py``) or written by hand for events only other services write.
Each must still decode, and fold to exactly the checked-in ``.state.json`` and
``.views.json``. A failure here means an existing log now means something else: if that
is intended, regenerate with ``python -m tests.golden.regen`` and review the diff
(see tests/golden/regen.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import msgspec
import pytest

from reel.shared.core.run.events import (
    AnyEvent,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BranchForked,
    InputAnswered,
    InputRequested,
    RunCreated,
)
from reel.shared.core.run.events import Commit as CommitT
from reel.shared.core.run.fold import apply_commit, fold
from reel.shared.core.run.state import RunState
from tests.golden.regen import GOLDEN_DIR, canonical, expectations, logs, read_log

LOGS = logs()


def _events(commits: list[tuple[int, CommitT]]) -> list[AnyEvent]:
    return [e for _, c in commits for e in c.events]


ALL = {p.name: read_log(p) for p in LOGS}
EVENTS = [e for commits in ALL.values() for e in _events(commits)]


def test_there_are_golden_logs() -> None:
    assert len(LOGS) >= 5
    assert {p.name.split("_")[0] for p in LOGS} == {"recorded", "hand"}


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem)
def test_golden_log_folds_to_its_expected_state(path: Path) -> None:
    for target, data in expectations(path).items():
        assert target.exists(), f"{target.name} missing: run `python -m tests.golden.regen`"
        expected = target.read_bytes()
        if expected != data:
            a, b = expected.decode().splitlines(), data.decode().splitlines()
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            pytest.fail(
                f"{path.name} no longer folds to {target.name} (line {first + 1}):\n"
                f"  expected: {a[first] if first < len(a) else '<eof>'}\n"
                f"  now:      {b[first] if first < len(b) else '<eof>'}\n"
                "If this change of meaning is intended: python -m tests.golden.regen, review, commit."
            )


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem)
def test_golden_log_is_a_well_formed_run_log(path: Path) -> None:
    commits = ALL[path.name]
    lsns = [lsn for lsn, _ in commits]
    assert lsns == sorted(set(lsns)), "LSNs strictly increase"
    first = commits[0][1].events[0]
    assert isinstance(first, RunCreated)
    assert {c.run_id for _, c in commits} == {first.run_id}
    assert len({c.commit_id for _, c in commits}) == len(commits), "commit ids are unique"
    for _, c in commits:
        assert c.events, "a commit carries at least one event"
        assert c.writer


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem)
def test_golden_log_folds_the_same_commit_by_commit(path: Path) -> None:
    commits = ALL[path.name]
    state: RunState | None = None
    for lsn, commit in commits:
        state = apply_commit(state, lsn, commit)
        assert canonical(state) == canonical(fold(commits, upto_lsn=lsn))
    assert canonical(state) == (path.with_suffix("").with_suffix(".state.json")).read_bytes()


def test_expectations_are_sensitive_to_the_log() -> None:
    """Guard against a vacuous comparison: a log missing its last commit must not match."""
    for path in LOGS:
        commits = ALL[path.name]
        truncated = fold(commits[:-1])
        assert canonical(truncated) != path.with_suffix("").with_suffix(".state.json").read_bytes(), path.name


def test_no_orphan_expectations() -> None:
    stems = {p.stem for p in LOGS}
    for f in GOLDEN_DIR.glob("*.json"):
        assert f.name.split(".")[0] in stems, f"{f.name} has no golden log"


# ---- coverage: what the golden logs must keep exercising ------------------------------------------


def test_every_event_type_is_in_a_golden_log() -> None:
    assert {type(e) for e in EVENTS} == set(get_args(AnyEvent)), "add the new event to a golden log"


def test_golden_logs_cover_human_input() -> None:
    asked = [e for e in EVENTS if isinstance(e, InputRequested)]
    assert {e.kind for e in asked} == {"approval", "question"} and any(e.deadline_ms for e in asked)
    answers = [e for e in EVENTS if isinstance(e, InputAnswered)]
    assert {(e.decision, e.source) for e in answers} >= {("approve", "respond"), ("reject", "respond")}
    assert any(e.arguments is not None for e in answers), "an approval with edited arguments"
    assert any(e.source == "deadline" for e in answers), "a deadline's default"


def test_golden_logs_cover_the_interesting_cases() -> None:
    outcomes = [e for e in EVENTS if isinstance(e, AttemptSucceeded | AttemptFailed)]
    assert any(isinstance(e, AttemptSucceeded) and e.recovered for e in outcomes), "recovered success"
    assert any(isinstance(e, AttemptFailed) and e.recovered for e in outcomes), "recovered failure"
    assert any(isinstance(e, AttemptFailed) and not e.retryable for e in outcomes), "non-retryable failure"
    forks = [e for e in EVENTS if isinstance(e, BranchForked)]
    assert {f.from_step is None for f in forks} == {True, False}, "forks with and without from_step"
    assert {isinstance(f.edits, tuple) for f in forks} == {True, False}, "forks with and without edits"
    assert any(isinstance(p.restored, tuple) for e in EVENTS if isinstance(e, AttemptDispatched)
               and (p := e.context) is not None), "a partition with items a fork restored"
    assert any(len(c.events) > 1 for commits in ALL.values() for _, c in commits), "a multi-event commit"
    parts = [e.context for e in EVENTS if isinstance(e, AttemptDispatched) and e.context is not None]
    assert any(p.packed and p.available and p.dropped for p in parts), "a partition with all three buckets"
    recorded = [e for name, commits in ALL.items() if name.startswith("recorded_") for e in _events(commits)]
    dispatched = {(e.step_id, e.attempt) for e in recorded if isinstance(e, AttemptDispatched)}
    resolved = {(e.step_id, e.attempt) for e in recorded if isinstance(e, AttemptSucceeded | AttemptFailed)}
    assert dispatched - resolved, "a recorded takeover leaves a superseded intent"


def test_golden_logs_cover_finish_reasons_usage_sources_and_error_bodies() -> None:
    outcomes = [e for e in EVENTS if isinstance(e, AttemptSucceeded | AttemptFailed)]
    assert {e.finish_reason for e in outcomes if isinstance(e.finish_reason, str)} >= {"stop", "length"}
    assert any(e.finish_reason is msgspec.UNSET for e in outcomes), "logs recorded before finish reasons"
    assert {e.usage.source for e in outcomes} >= {msgspec.UNSET, "reported", "estimated", "none"}
    assert any(isinstance(e, AttemptFailed) and e.error_kind == "truncated" and e.error_ref for e in outcomes)
    assert any(isinstance(e, AttemptSucceeded) and e.truncated is True and e.finish_reason == "length"
               for e in outcomes), "a cut answer taken (on_truncated: continue)"


def test_golden_lines_are_lsn_and_commit_only() -> None:
    for path in LOGS:
        for line in path.read_bytes().splitlines():
            assert set(msgspec.json.decode(line)) == {"lsn", "commit"}, path.name
