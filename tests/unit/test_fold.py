"""The fold: pure, deterministic, and exact about step status and branch inheritance.

No server here: commits are built by hand (and, for the property test, by a small
model of a run's life that also predicts what the fold must conclude).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reel.shared.core.errors import InvalidTransition
from reel.shared.core.run.events import (
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    BranchForked,
    Commit,
    ContextPartition,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunStarted,
    RunVerifying,
    StepDecl,
    Usage,
    Verdict,
    VerdictRecorded,
    decode_commit,
    encode_commit,
)
from reel.shared.core.run.fold import apply_commit, fold
from reel.shared.core.run.state import (
    INTERRUPTED,
    RunState,
    attempts_status,
    branch_failed,
    branch_terminal,
    step_status,
)
from reel.shared.core.run.statecodec import STATE_ENCODER, decode_state
from reel.shared.core.run.views import build_episode_view

_enc = STATE_ENCODER  # the state's maps are FrozenMaps: msgspec needs the state codec's hooks
REF = BlobRef(sha256="0" * 64, size_bytes=10, media_type="application/json")
OUT = BlobRef(sha256="1" * 64, size_bytes=3)


def created(*steps: tuple[str, int], run_id: str = "r-1", verifiers: tuple[str, ...] = ()) -> RunCreated:
    decls = tuple(StepDecl(step_id=s, kind="model" if i % 2 == 0 else "tool", max_attempts=m)
                  for i, (s, m) in enumerate(steps))
    return RunCreated(run_id=run_id, branch_id="main", workflow_name="w", workflow_ref=REF, steps=decls,
                      created_ms=1000, verifiers=verifiers)


def dispatched(step: str, attempt: int, branch: str = "main", executor: str = "x-1") -> AttemptDispatched:
    return AttemptDispatched(branch_id=branch, step_id=step, attempt=attempt, executor_id=executor, at_ms=2000,
                             prompt_ref=REF, context=ContextPartition(packed=("a",), available=("b",), dropped=()))


def succeeded(step: str, attempt: int, branch: str = "main", recovered: bool = False) -> AttemptSucceeded:
    return AttemptSucceeded(branch_id=branch, step_id=step, attempt=attempt, output_ref=OUT,
                            usage=Usage(input_tokens=5, output_tokens=2, latency_ms=1.5), at_ms=3000,
                            recovered=recovered)


def failed(step: str, attempt: int, branch: str = "main", retryable: bool = True) -> AttemptFailed:
    return AttemptFailed(branch_id=branch, step_id=step, attempt=attempt, error_kind="boom", message="it broke",
                         retryable=retryable, at_ms=3000)


class Log:
    """Builds a run's ``(lsn, Commit)`` list; LSNs have gaps, as on a shared stream."""

    def __init__(self, run_id: str = "r-1") -> None:
        self.run_id = run_id
        self.commits: list[tuple[int, Commit]] = []
        self._lsn = 0

    def add(self, *events: AnyEvent) -> int:
        self._lsn += 3
        self.commits.append((self._lsn, Commit(commit_id=f"c{self._lsn}", run_id=self.run_id, events=events)))
        return self._lsn

    def state(self) -> RunState:
        s = fold(self.commits)
        assert s is not None
        return s


def three_step_log() -> Log:
    log = Log()
    log.add(created(("a", 1), ("b", 3), ("c", 1)))
    log.add(RunStarted(executor_id="x-1", at_ms=1500))
    return log


# ---- determinism ---------------------------------------------------------------------------------


def test_fold_is_deterministic_and_survives_the_wire() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1))
    log.add(succeeded("a", 1))
    log.add(dispatched("b", 1))
    log.add(failed("b", 1))
    first, second = log.state(), log.state()
    assert first is not second
    assert _enc.encode(first) == _enc.encode(second)
    wire = [(lsn, decode_commit(encode_commit(c))) for lsn, c in log.commits]
    assert _enc.encode(fold(wire)) == _enc.encode(first)
    assert first.head_lsn == log.commits[-1][0] and first.commits == len(log.commits)


def test_fold_of_nothing_is_none() -> None:
    assert fold([]) is None


# ---- step status ---------------------------------------------------------------------------------


def test_step_status_pending_running_retrying_succeeded() -> None:
    log = three_step_log()
    assert step_status(log.state(), "main", "b") == "pending"
    log.add(dispatched("a", 1))
    assert step_status(log.state(), "main", "a") == "running"
    log.add(succeeded("a", 1))
    log.add(dispatched("b", 1))
    log.add(failed("b", 1))
    s = log.state()
    assert step_status(s, "main", "a") == "succeeded"
    assert step_status(s, "main", "b") == "retrying"  # 1 of 3 attempts failed, retryable
    assert not branch_terminal(s, "main")
    log.add(dispatched("b", 2))
    log.add(succeeded("b", 2))
    s = log.state()
    assert step_status(s, "main", "b") == "succeeded"
    failed_b = s.branches["main"].attempts["b"][0]
    assert (failed_b.status, failed_b.error_kind, failed_b.error_message) == ("failed", "boom", "it broke")


def test_step_fails_after_max_attempts_failed() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1), succeeded("a", 1))
    for n in (1, 2):
        log.add(dispatched("b", n))
        log.add(failed("b", n))
        assert step_status(log.state(), "main", "b") == "retrying"
    log.add(dispatched("b", 3))
    log.add(failed("b", 3))
    s = log.state()
    assert step_status(s, "main", "b") == "failed"
    assert step_status(s, "main", "c") == "skipped"
    assert branch_terminal(s, "main") and branch_failed(s, "main")


def test_max_attempts_counts_failed_attempts_only() -> None:
    """Dispatched attempts superseded by a takeover do not use up the step's attempts."""
    log = three_step_log()
    log.add(dispatched("a", 1), succeeded("a", 1))
    log.add(dispatched("b", 1, executor="x-dead"))
    log.add(dispatched("b", 2, executor="x-dead-too"))
    log.add(dispatched("b", 3))
    log.add(failed("b", 3))
    s = log.state()
    assert [a.status for a in s.branches["main"].attempts["b"]] == ["dispatched", "dispatched", "failed"]
    assert step_status(s, "main", "b") == "retrying"  # 3 attempts, only 1 failed, max_attempts=3
    log.add(dispatched("b", 4))
    log.add(failed("b", 4))
    assert step_status(log.state(), "main", "b") == "retrying"
    log.add(dispatched("b", 5))
    log.add(failed("b", 5))
    assert step_status(log.state(), "main", "b") == "failed"


def test_non_retryable_failure_ends_the_step_and_skips_the_rest() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1), succeeded("a", 1))
    log.add(dispatched("b", 1))
    log.add(failed("b", 1, retryable=False))
    s = log.state()
    assert step_status(s, "main", "b") == "failed"  # max_attempts=3 but not retryable
    assert step_status(s, "main", "c") == "skipped"
    assert step_status(s, "main", "a") == "succeeded"
    assert branch_terminal(s, "main")


def test_skipped_only_after_a_terminal_failure() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1))
    log.add(failed("a", 1))  # a has max_attempts=1: terminal
    s = log.state()
    assert step_status(s, "main", "a") == "failed"
    assert step_status(s, "main", "b") == "skipped"
    assert step_status(s, "main", "c") == "skipped"
    log2 = three_step_log()
    log2.add(dispatched("a", 1), succeeded("a", 1))
    log2.add(dispatched("b", 1))
    log2.add(failed("b", 1))  # retrying, not terminal
    assert step_status(log2.state(), "main", "c") == "pending"


def test_superseded_dispatched_attempt_does_not_block_success() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1, executor="x-dead"))
    log.add(RunStarted(executor_id="x-2", at_ms=5000))
    log.add(dispatched("a", 2, executor="x-2"))
    log.add(succeeded("a", 2))
    s = log.state()
    assert s.executor_id == "x-2"
    assert step_status(s, "main", "a") == "succeeded"
    view = build_episode_view(s).step("a")
    assert [(a.attempt, a.status, a.superseded) for a in view.attempts] == [
        (1, "dispatched", True), (2, "succeeded", False)]
    # recovery later resolves the superseded intent; the step stays succeeded
    log.add(AttemptFailed(branch_id="main", step_id="a", attempt=1, error_kind="lost", message="executor died",
                          at_ms=9000, recovered=True))
    s = log.state()
    a1 = s.branches["main"].attempts["a"][0]
    assert (a1.status, a1.recovered, a1.error_kind) == ("failed", True, "lost")
    assert step_status(s, "main", "a") == "succeeded"


# ---- lifecycle -----------------------------------------------------------------------------------


def test_run_status_follows_the_lifecycle() -> None:
    log = Log()
    log.add(created(("a", 1), verifiers=("v",)))
    assert log.state().status == "pending"
    log.add(RunStarted(executor_id="x-1", at_ms=1))
    assert log.state().status == "running"
    log.add(dispatched("a", 1), succeeded("a", 1))
    v_lsn = log.add(RunVerifying(branch_id="main", at_ms=4000))
    s = log.state()
    assert (s.status, s.verifying_lsn, s.verifying_branch) == ("verifying", v_lsn, "main")
    verdict = Verdict(run_id="r-1", branch_id="main", snapshot_lsn=v_lsn, verifier="v", status="pass", score=1.0)
    log.add(VerdictRecorded(verdict=verdict), RunCompleted(branch_id="main", outcome="passed", at_ms=5000))
    s = log.state()
    assert (s.status, s.outcome, s.finished_ms, s.verdicts) == ("completed", "passed", 5000, (verdict,))


def test_cancel_is_terminal_with_reason() -> None:
    log = Log()
    log.add(created(("a", 1)))
    log.add(RunCancelled(reason="user asked", at_ms=7))
    s = log.state()
    assert (s.status, s.cancel_reason, s.finished_ms) == ("cancelled", "user asked", 7)


def test_cancelled_attempt_is_terminal_and_not_a_failure() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1), succeeded("a", 1))
    log.add(dispatched("b", 1))
    log.add(RunCancelled(reason="stop", at_ms=4000))
    lsn = log.add(AttemptCancelled(branch_id="main", step_id="b", attempt=1, reason="run cancelled: stop",
                                   usage=Usage(latency_ms=12.0), at_ms=4001))
    s = log.state()
    [b] = s.branches["main"].attempts["b"]
    assert (b.status, b.outcome_lsn, b.finished_ms, b.error_kind, b.error_message, b.usage.latency_ms) == (
        "cancelled", lsn, 4001, "cancelled", "run cancelled: stop", 12.0)
    assert step_status(s, "main", "b") == "cancelled" and step_status(s, "main", "c") == "pending"
    assert not branch_terminal(s, "main") and not branch_failed(s, "main")  # cancelled is not failed
    view = build_episode_view(s)
    assert view.failed_attempts == 0 and [a.status for a in view.step("b").attempts] == ["cancelled"]
    # a cancelled attempt is not a try: with max_attempts=1 the step would still take another attempt
    assert attempts_status(s.branches["main"].attempts["b"], 1) == "cancelled"


def test_an_attempt_interrupted_by_shutdown_is_not_a_try_of_the_step() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1))
    log.add(AttemptFailed(branch_id="main", step_id="a", attempt=1, error_kind=INTERRUPTED, message="drained",
                          retryable=True, at_ms=3000))
    assert step_status(log.state(), "main", "a") == "retrying"  # max_attempts=1, yet it is retried
    log.add(dispatched("a", 2))
    log.add(failed("a", 2))
    assert step_status(log.state(), "main", "a") == "failed"  # the real failure counts


# ---- branches ------------------------------------------------------------------------------------


def forked_log() -> tuple[Log, dict[str, int]]:
    log = three_step_log()
    lsn = {}
    lsn["a_d"] = log.add(dispatched("a", 1))
    lsn["a_s"] = log.add(succeeded("a", 1))
    lsn["b_d"] = log.add(dispatched("b", 1))
    lsn["b_f"] = log.add(failed("b", 1))
    lsn["b2_d"] = log.add(dispatched("b", 2))
    lsn["b2_s"] = log.add(succeeded("b", 2))
    lsn["c_d"] = log.add(dispatched("c", 1))
    lsn["c_s"] = log.add(succeeded("c", 1))
    lsn["verifying"] = log.add(RunVerifying(branch_id="main", at_ms=1))
    return log, lsn


def _attempts(state: RunState, branch: str) -> dict[str, list[tuple[int, str]]]:
    return {s: [(a.attempt, a.status) for a in atts] for s, atts in state.branches[branch].attempts.items()}


def test_fork_inherits_as_of_fork_lsn() -> None:
    log, lsn = forked_log()
    parent_before = _enc.encode(log.state().branches["main"])
    # fork between b#2's intent and its outcome: b#2 is inherited as still dispatched, c not at all
    fork_lsn = log.add(BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=lsn["b2_d"], at_ms=1))
    s = log.state()
    assert _attempts(s, "b-1") == {"a": [(1, "succeeded")], "b": [(1, "failed"), (2, "dispatched")]}
    b2 = s.branches["b-1"].attempts["b"][1]
    assert (b2.outcome_lsn, b2.output_ref, b2.usage) == (None, None, Usage())
    assert s.branches["b-1"].attempts["b"][0].error_kind == "boom"  # failed records inherited intact
    assert (s.status, s.active_branch, s.verifying_lsn, s.verifying_branch) == ("running", "b-1", None, None)
    info = s.branches["b-1"]
    assert (info.parent_branch_id, info.fork_lsn, info.from_step, info.created_lsn) == (
        "main", lsn["b2_d"], None, fork_lsn)
    assert _enc.encode(s.branches["main"]) == parent_before, "the parent's records must never change"


def test_fork_from_step_keeps_only_earlier_steps() -> None:
    log, lsn = forked_log()
    log.add(BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=lsn["verifying"], from_step="b",
                         at_ms=1))
    s = log.state()
    assert _attempts(s, "b-1") == {"a": [(1, "succeeded")]}
    assert step_status(s, "b-1", "b") == "pending"
    assert not branch_terminal(s, "b-1") and branch_terminal(s, "main")


def test_fork_copies_are_not_aliased_to_the_parent() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1))
    d_lsn = log.add(dispatched("b", 1))  # (dispatching b before a finished is legal for the fold)
    log.add(BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=d_lsn, at_ms=1))
    log.add(succeeded("a", 1, branch="main"))  # an outcome on the parent after the fork
    log.add(failed("b", 1, branch="b-1"))  # and one on the child
    s = log.state()
    assert _attempts(s, "main") == {"a": [(1, "succeeded")], "b": [(1, "dispatched")]}
    assert _attempts(s, "b-1") == {"a": [(1, "dispatched")], "b": [(1, "failed")]}


def test_fork_of_a_fork_and_views_lineage() -> None:
    log, lsn = forked_log()
    f1 = log.add(BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=lsn["verifying"], from_step="c",
                              at_ms=1))
    log.add(dispatched("c", 2, branch="b-1"))
    log.add(BranchForked(branch_id="b-2", parent_branch_id="b-1", fork_lsn=f1, from_step="b", at_ms=1))
    s = log.state()
    assert _attempts(s, "b-2") == {"a": [(1, "succeeded")]}
    assert [b.branch_id for b in build_episode_view(s).lineage] == ["main", "b-1", "b-2"]


# ---- impossible events ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(succeeded("a", 1), id="outcome-undispatched"),
        pytest.param(failed("a", 2), id="failure-undispatched"),
        pytest.param(succeeded("a", 1, branch="nope"), id="outcome-unknown-branch"),
        pytest.param(dispatched("a", 1, branch="nope"), id="dispatch-unknown-branch"),
        pytest.param(BranchForked(branch_id="b-1", parent_branch_id="nope", fork_lsn=1, at_ms=1),
                     id="fork-unknown-parent"),
        pytest.param(created(("a", 1)), id="second-run-created"),
    ],
)
def test_impossible_events_raise_invalid_transition(event: AnyEvent) -> None:
    log = three_step_log()
    log.add(event)
    with pytest.raises(InvalidTransition) as info:
        fold(log.commits)
    assert info.value.run_id == "r-1"


def test_outcome_for_an_undispatched_attempt_names_it() -> None:
    log = three_step_log()
    log.add(dispatched("a", 1))
    log.add(succeeded("a", 2))
    with pytest.raises(InvalidTransition, match=r"a#2"):
        fold(log.commits)


@pytest.mark.parametrize(
    "events",
    [pytest.param((RunStarted(executor_id="x", at_ms=1),), id="started-first"), pytest.param((), id="empty")],
)
def test_first_commit_must_be_run_created(events: tuple[AnyEvent, ...]) -> None:
    with pytest.raises(InvalidTransition, match="run_created"):
        apply_commit(None, 1, Commit(commit_id="c", run_id="r-9", events=events))


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(dispatched("zzz", 1), id="dispatch"),
        pytest.param(BranchForked(branch_id="b-1", parent_branch_id="main", fork_lsn=1, from_step="zzz", at_ms=1),
                     id="fork-from-step"),
    ],
)
def test_undeclared_step_is_an_invalid_transition_not_a_key_error(event: AnyEvent) -> None:
    log = three_step_log()
    log.add(event)
    with pytest.raises(InvalidTransition, match="zzz"):
        fold(log.commits)


# ---- upto_lsn ------------------------------------------------------------------------------------


def test_upto_lsn_truncates() -> None:
    log, lsn = forked_log()
    lsns = [n for n, _ in log.commits]
    for i, n in enumerate(lsns):
        at = fold(log.commits, upto_lsn=n)
        prefix = fold(log.commits[: i + 1])
        assert at is not None and at.head_lsn == n and at.commits == i + 1
        assert _enc.encode(at) == _enc.encode(prefix)
        between = fold(log.commits, upto_lsn=n + 1)  # LSNs of other runs in between change nothing
        assert _enc.encode(between) == _enc.encode(prefix)
    assert fold(log.commits, upto_lsn=lsns[0] - 1) is None
    assert step_status(fold(log.commits, upto_lsn=lsn["b_f"]), "main", "b") == "retrying"  # type: ignore[arg-type]
    assert fold(log.commits, upto_lsn=lsn["b_f"]).status == "running"  # type: ignore[union-attr]


# ---- property: a small model of a run's life -----------------------------------------------------

STEPS = (("s1", 1), ("s2", 2), ("s3", 3))


@dataclass
class Model:
    """What the fold must conclude, tracked independently: status and each branch's attempts."""

    status: str = "pending"
    active: str = "main"
    # branch → step → [(attempt, status, dispatched_lsn, outcome_lsn)]
    branches: dict[str, dict[str, list[list[object]]]] = field(default_factory=lambda: {"main": {}})
    lsns: list[int] = field(default_factory=list)
    verifying_lsn: int | None = None
    judged: set[tuple[str, int, str]] = field(default_factory=set)  # (branch, snapshot, verifier) recorded

    def open_attempts(self) -> list[tuple[str, str, int]]:
        return [(b, s, int(a[0]))  # type: ignore[call-overload]
                for b, steps in self.branches.items() for s, atts in steps.items() for a in atts
                if a[1] == "dispatched"]

    def fork(self, child: str, parent: str, fork_lsn: int, from_step: str | None) -> None:
        order = [s for s, _ in STEPS]
        cutoff = order.index(from_step) if from_step else len(order)
        out: dict[str, list[list[object]]] = {}
        for s, atts in self.branches[parent].items():
            if order.index(s) >= cutoff:
                continue
            kept = []
            for att, status, d_lsn, o_lsn in atts:
                if d_lsn > fork_lsn:  # type: ignore[operator]
                    continue
                if o_lsn is not None and o_lsn > fork_lsn:  # type: ignore[operator]
                    status, o_lsn = "dispatched", None
                kept.append([att, status, d_lsn, o_lsn])
            if kept:
                out[s] = kept
        self.branches[child] = out
        self.active, self.status, self.verifying_lsn = child, "running", None


VERIFIERS = ("v1", "v2")


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[tuple[int, Commit]], Model]:
    model = Model()
    lsn = draw(st.integers(1, 50))
    first = created(*STEPS, run_id="r-p", verifiers=VERIFIERS)
    commits = [(lsn, Commit(commit_id="c0", run_id="r-p", events=(first,)))]
    model.lsns.append(lsn)
    forks = 0
    for n in range(draw(st.integers(0, 30))):
        if model.status == "cancelled":
            break
        lsn += draw(st.integers(1, 5))
        events: list[AnyEvent] = []
        for _ in range(draw(st.integers(1, 3))):
            # weighted by repetition; cancel is rare because it ends the history
            moves = ["dispatch"] * 4 + ["started"] if model.status in ("pending", "running") else []
            if model.open_attempts():
                moves += ["outcome"] * 4
            if model.status == "running":
                moves += ["verifying", "fork"]
            if model.status == "verifying":
                moves += ["verdict", "verdict", "complete", "fork"]
            if model.status == "completed":
                moves.append("fork")
            if model.status != "completed" and n > 8:
                moves.append("cancel")
            if not moves:
                break
            move = draw(st.sampled_from(moves))
            if move == "started":
                events.append(RunStarted(executor_id=draw(st.sampled_from(["x-1", "x-2"])), at_ms=lsn))
                model.status = "running"
            elif move == "dispatch":
                step = draw(st.sampled_from([s for s, _ in STEPS]))
                atts = model.branches[model.active].setdefault(step, [])
                nxt = int(atts[-1][0]) + 1 if atts else 1  # type: ignore[call-overload]
                events.append(dispatched(step, nxt, branch=model.active))
                atts.append([nxt, "dispatched", lsn, None])
                model.status = "running"
            elif move == "outcome":
                b, s, att = draw(st.sampled_from(model.open_attempts()))
                ok = draw(st.booleans())
                recovered = draw(st.booleans())
                events.append(succeeded(s, att, b, recovered) if ok else failed(s, att, b, draw(st.booleans())))
                rec = next(a for a in model.branches[b][s] if a[0] == att)
                rec[1], rec[3] = ("succeeded" if ok else "failed"), lsn
            elif move == "verifying":
                events.append(RunVerifying(branch_id=model.active, at_ms=lsn))
                model.status, model.verifying_lsn = "verifying", lsn
            elif move == "verdict":  # once per verifier, by a job at the snapshot, in a later commit
                at = model.verifying_lsn
                left = [v for v in VERIFIERS if at is not None and (model.active, at, v) not in model.judged]
                if at is None or at >= lsn or not left:
                    continue
                verifier = draw(st.sampled_from(left))
                model.judged.add((model.active, at, verifier))
                events.append(VerdictRecorded(verdict=Verdict(
                    run_id="r-p", branch_id=model.active, snapshot_lsn=at, verifier=verifier,
                    status=draw(st.sampled_from(["pass", "fail", "error"])), score=draw(st.floats(0, 1)))))
            elif move == "complete":
                events.append(RunCompleted(branch_id=model.active, outcome="passed", at_ms=lsn))
                model.status = "completed"
            elif move == "cancel":
                events.append(RunCancelled(reason=draw(st.text(max_size=5)), at_ms=lsn))
                model.status = "cancelled"
                break
            else:
                forks += 1
                parent = draw(st.sampled_from(sorted(model.branches)))
                fork_lsn = draw(st.sampled_from(model.lsns))
                from_step = draw(st.none() | st.sampled_from([s for s, _ in STEPS]))
                child = f"b-{forks}"
                events.append(BranchForked(branch_id=child, parent_branch_id=parent, fork_lsn=fork_lsn,
                                           from_step=from_step, at_ms=lsn))
                model.fork(child, parent, fork_lsn, from_step)
        if events:
            commits.append((lsn, Commit(commit_id=f"c{n + 1}", run_id="r-p", writer="w", events=tuple(events))))
            model.lsns.append(lsn)
    return commits, model


@settings(max_examples=200, deadline=None)
@given(runs())
def test_fold_in_one_go_equals_commit_by_commit(run: tuple[list[tuple[int, Commit]], Model]) -> None:
    commits, model = run
    whole = fold(commits)
    assert whole is not None
    encoded = _enc.encode(whole)

    state: RunState | None = None
    for i, (lsn, commit) in enumerate(commits):
        state = apply_commit(state, lsn, commit)
        # every intermediate state equals a cold fold truncated at that LSN
        assert _enc.encode(state) == _enc.encode(fold(commits, upto_lsn=lsn)), f"diverged at commit {i}"
    assert _enc.encode(state) == encoded

    # the commits survive the wire, and so does the state
    wire = [(lsn, decode_commit(encode_commit(c))) for lsn, c in commits]
    assert wire == commits
    assert _enc.encode(fold(wire)) == encoded
    assert _enc.encode(decode_state(encoded)) == encoded

    # and the fold agrees with the independent model
    assert whole.status == model.status and whole.active_branch == model.active
    assert set(whole.branches) == set(model.branches)
    for bid, steps in model.branches.items():
        expected = {s: [(a[0], a[1], a[2], a[3]) for a in atts] for s, atts in steps.items() if atts}
        got = {s: [(a.attempt, a.status, a.dispatched_lsn, a.outcome_lsn) for a in atts]
               for s, atts in whole.branches[bid].attempts.items()}
        assert got == expected, bid
        for decl in whole.steps:  # derived status is total (never raises) on any valid history
            assert step_status(whole, bid, decl.step_id) in (
                "pending", "running", "retrying", "succeeded", "failed", "skipped")


@settings(max_examples=100, deadline=None)
@given(runs())
def test_a_state_handed_out_never_changes(run: tuple[list[tuple[int, Commit]], Model]) -> None:
    """One fold style: every state is immutable — folding on (from it, or from an earlier one) leaves it as it was."""
    commits, _ = run
    states: list[RunState] = []
    state: RunState | None = None
    for lsn, commit in commits:
        state = apply_commit(state, lsn, commit)
        states.append(state)
    before = [_enc.encode(s) for s in states]
    # a second future of every state: re-apply the same later commits from each earlier state
    for i, s in enumerate(states[:-1]):
        again = fold(commits[i + 1:], start=s)
        assert again is not None and _enc.encode(again) == before[-1]
    assert [_enc.encode(s) for s in states] == before
    for s in states:
        with pytest.raises(AttributeError):
            s.status = "cancelled"  # type: ignore[misc]
        for b in s.branches.values():
            for atts in b.attempts.values():
                assert isinstance(atts, tuple)
