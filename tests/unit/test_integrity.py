"""Poison isolation in the core (shared/core/run/integrity.py, shared/core/run/lifecycle.py): pure, no server.

Good logs — every golden log — fold through the checked path exactly as through
``fold``; a bad commit (undecodable, naming another run, an illegal transition)
is reported at its LSN with its reason, with the state as of the last good commit.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from reel.shared.core.run.events import (
    AttemptDispatched,
    AttemptSucceeded,
    BlobRef,
    Commit,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunStarted,
    RunVerifying,
    StepDecl,
    Verdict,
    VerdictRecorded,
    encode_commit,
)
from reel.shared.core.run.fold import fold
from reel.shared.core.run.ids import LSN, BranchId, RunId
from reel.shared.core.run.integrity import (
    Corruption,
    CorruptionKind,
    RunCorrupt,
    check_commit,
    decode_log,
    fold_checked,
    fold_or_raise,
)
from reel.shared.core.run.statecodec import encode_state
from reel.shared.core.verify.verification import corrupt_verdicts
from tests.golden.regen import GoldenLine, logs

REF = BlobRef(sha256="a" * 64, size_bytes=3)
RUN = "r-1"


def commit(*events: object, run_id: str = RUN, cid: str = "c") -> Commit:
    return Commit(commit_id=cid, run_id=run_id, writer="w", events=tuple(events))  # type: ignore[arg-type]


def history() -> list[tuple[int, Commit]]:
    """10 created, 11 started, 12 a#1, 13 a ok, 14 verifying."""
    created = RunCreated(run_id=RUN, branch_id="main", workflow_name="w", workflow_ref=REF, created_ms=0,
                         steps=(StepDecl(step_id="a", kind="tool"),), verifiers=("v1", "v2"))
    return [(10, commit(created, cid="c0")), (11, commit(RunStarted(executor_id="x-1", at_ms=1), cid="c1")),
            (12, commit(AttemptDispatched(branch_id="main", step_id="a", attempt=1, executor_id="x-1", at_ms=2),
                        cid="c2")),
            (13, commit(AttemptSucceeded(branch_id="main", step_id="a", attempt=1, output_ref=REF, at_ms=3),
                        cid="c3")),
            (14, commit(RunVerifying(branch_id="main", at_ms=4), cid="c4"))]


def raw(commits: list[tuple[int, Commit]]) -> list[tuple[int, bytes]]:
    return [(lsn, encode_commit(c)) for lsn, c in commits]


@pytest.mark.parametrize("path", logs(), ids=lambda p: p.stem)
def test_golden_logs_fold_through_the_checked_path_byte_for_byte(path: Path) -> None:
    lines = [msgspec.json.decode(line, type=GoldenLine) for line in path.read_bytes().splitlines() if line.strip()]
    run_id = msgspec.json.decode(bytes(lines[0].commit), type=Commit).run_id
    commits, bad = decode_log(run_id, [(g.lsn, bytes(g.commit)) for g in lines])
    assert bad is None
    state, illegal = fold_checked(commits)
    assert illegal is None and state is not None
    expected = path.with_suffix("").with_suffix(".state.json").read_bytes()
    assert msgspec.json.format(encode_state(state), indent=2) + b"\n" == expected


@pytest.mark.parametrize(("body", "kind", "words"), [
    (b"\x00garbage{", CorruptionKind.UNDECODABLE, "does not decode"),
    (b'{"commit_id": "c", "run_id": "r-1", "events": [{"type": "run_teleported", "at_ms": 1}]}',
     CorruptionKind.UNDECODABLE, "run_teleported"),
    (encode_commit(commit(RunCancelled(reason="x", at_ms=1), run_id="r-other")), CorruptionKind.FOREIGN_RUN,
     "names another run ('r-other')"),
    (encode_commit(commit(VerdictRecorded(verdict=Verdict(run_id="r-other", branch_id="main", snapshot_lsn=14,
                                                          verifier="v1", status="pass")))),
     CorruptionKind.FOREIGN_RUN, "r-other"),
])
def test_a_bad_body_is_the_run_corrupt_at_its_lsn(body: bytes, kind: CorruptionKind, words: str) -> None:
    found = check_commit(RUN, 15, body)
    assert isinstance(found, Corruption)
    assert (found.run_id, found.lsn, found.kind) == (RUN, 15, kind) and words in found.reason
    good, bad = decode_log(RUN, [*raw(history()), (15, body), *raw([(16, commit(RunCancelled(at_ms=9)))])])
    assert [lsn for lsn, _ in good] == [10, 11, 12, 13, 14] and bad == found  # nothing above it is read


@pytest.mark.parametrize(("event", "words"), [
    (AttemptSucceeded(branch_id="main", step_id="zzz", attempt=9, output_ref=REF, at_ms=5), "never dispatched"),
    (RunCompleted(branch_id="main", outcome="passed", at_ms=5), "run_completed"),  # mid-run: never by Reel
    (RunCreated(run_id=RUN, branch_id="main", workflow_name="w", workflow_ref=REF, created_ms=0, steps=()),
     "run_created on an existing run"),
])
def test_an_illegal_transition_keeps_the_state_of_the_last_good_commit(event: object, words: str) -> None:
    commits = [*history()[:3], (13, commit(RunStarted(executor_id="x-2", at_ms=4), event)),
               *[(lsn + 1, c) for lsn, c in history()[3:]]]
    state, bad = fold_checked(commits)
    assert bad is not None and (bad.lsn, bad.kind) == (13, CorruptionKind.INVALID_TRANSITION)
    assert words in bad.reason
    assert state is not None
    assert encode_state(state) == encode_state(fold(commits[:3])), "the half-applied commit left no trace"
    with pytest.raises(RunCorrupt) as info:
        fold_or_raise(commits)
    assert info.value.code == "run_corrupt" and info.value.corruption == bad and info.value.state == state
    assert info.value.message == f"run {RUN} is corrupt at LSN 13: {bad.reason}"


def test_a_first_commit_that_is_not_run_created_leaves_no_state() -> None:
    state, bad = fold_checked([(7, commit(RunStarted(executor_id="x", at_ms=1)))])
    assert state is None and bad is not None and (bad.lsn, bad.kind) == (7, "invalid_transition")


def test_only_a_verification_completes_a_run_and_an_ended_run_is_not_cancelled() -> None:
    def ending(*events: object) -> Corruption | None:
        return fold_checked([*history(), (15, commit(*events))])[1]

    assert ending(RunCompleted(branch_id="main", outcome="passed", snapshot_lsn=LSN(14), at_ms=5)) is None
    assert ending(RunCompleted(branch_id="main", outcome="passed", at_ms=5)) is None  # older logs: no snapshot
    assert ending(RunCompleted(branch_id="main", outcome="passed", snapshot_lsn=LSN(13), at_ms=5)) is not None
    assert ending(RunCompleted(branch_id="b-x", outcome="passed", snapshot_lsn=LSN(14), at_ms=5)) is not None
    assert ending(RunCancelled(at_ms=5)) is None
    done = RunCompleted(branch_id="main", outcome="passed", snapshot_lsn=LSN(14), at_ms=5)
    for again in (RunCancelled(at_ms=6), done):
        bad = ending(done, again)
        assert bad is not None and bad.kind == "invalid_transition", again


def test_a_corrupt_run_gets_an_error_verdict_from_each_verifier_not_yet_recorded() -> None:
    v1 = Verdict(run_id=RUN, branch_id="main", snapshot_lsn=14, verifier="v1", status="pass", score=1.0)
    good = [*history(), (15, commit(VerdictRecorded(verdict=v1)))]
    state = fold(good)
    bad = Corruption(run_id=RunId(RUN), lsn=LSN(16), kind=CorruptionKind.UNDECODABLE, reason="the commit does not"
                     " decode (JSON is malformed)")
    verdicts = corrupt_verdicts(RunId(RUN), BranchId("main"), LSN(14), RunCorrupt(bad, state), at_ms=7)
    assert [(v.verifier, v.status, v.snapshot_lsn, v.at_ms) for v in verdicts] == [("v2", "error", 14, 7)]
    assert verdicts[0].reason == "run r-1 is corrupt at LSN 16: the commit does not decode (JSON is malformed)"
    assert corrupt_verdicts(RunId(RUN), BranchId("main"), LSN(14), RunCorrupt(bad, None), at_ms=7) == []
