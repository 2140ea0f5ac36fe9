"""``reel compare``'s pure parts: where two branches first differ, the partition diff, the output diff."""

from __future__ import annotations

import msgspec

from reel.shared.core.run.compare import DIFF_MAX_LINES, first_divergence, output_diff, partition_diff
from reel.shared.core.run.eventfields import BlobRef, ContextPartition
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ContextItemId, ExecutorId, RunId, StepId
from reel.shared.core.run.state import AttemptStatus, RunStatus, StepStatus
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView


def _ref(c: str) -> BlobRef:
    return BlobRef(sha256=c * 64, size_bytes=1)


def _view(branch: str, *turns: tuple[str, str, str, ContextPartition | None]) -> EpisodeView:
    steps = tuple(StepView(step_id=StepId(s), kind="model", status=StepStatus.SUCCEEDED, attempts=(AttemptView(
        step_id=StepId(s), attempt=AttemptNo(1), status=AttemptStatus.SUCCEEDED, executor_id=ExecutorId("x"),
        dispatched_lsn=LSN(1), prompt_ref=_ref(p), output_ref=_ref(o), context=part),)) for s, p, o, part in turns)
    return EpisodeView(run_id=RunId("r"), workflow_name="w", branch_id=BranchId(branch), snapshot_lsn=LSN(9),
                       status=RunStatus.COMPLETED, lineage=(), steps=steps)


def _part(*packed: str, dropped: tuple[str, ...] = (), why: tuple[str, ...] = ()) -> ContextPartition:
    return ContextPartition(packed=tuple(map(ContextItemId, packed)), available=(),
                            dropped=tuple(map(ContextItemId, dropped)), drop_reasons=why or msgspec.UNSET)


def test_first_divergence_names_the_step_and_what_differs() -> None:
    base = _view("main", ("a:t1", "1", "2", None), ("a:t2", "3", "4", None))
    assert first_divergence(_view("b", ("a:t1", "1", "2", None), ("a:t2", "3", "5", None)), base).step_id == "a:t2"
    found = first_divergence(_view("b", ("a:t1", "9", "2", None)), base)
    assert (found.step_id, found.what) == ("a:t1", "prompt")
    found = first_divergence(_view("b", ("a:t1", "1", "2", None)), base)
    assert (found.step_id, found.what) == ("a:t2", "missing")  # the baseline went on, the branch did not
    assert first_divergence(base, base).step_id is None


def test_partition_diff_lists_packed_both_ways_and_the_forks_items() -> None:
    base = _view("main", ("a:t1", "1", "2", _part("i", "layout", dropped=("old",), why=("stale",))))
    mine = _view("b", ("a:t1", "1", "2", _part("i", "old", dropped=("layout",), why=("dropped_by_fork",))))
    d = partition_diff(mine, base, StepId("a:t1"))
    assert (d.packed_added, d.packed_removed, d.dropped_by_fork, d.missing) == (("old",), ("layout",), ("layout",),
                                                                                 False)
    assert partition_diff(mine, base, StepId("a:t9")).missing


def test_output_diff_is_unified_and_bounded() -> None:
    assert output_diff(BranchId("b"), BranchId("main"), "x", "x").same
    d = output_diff(BranchId("b"), BranchId("main"), "one\ntwo", "one\nthree")
    assert not d.same and "--- main" in d.diff and "+++ b" in d.diff and "-three" in d.diff and "+two" in d.diff
    long = output_diff(BranchId("b"), BranchId("main"), "\n".join(map(str, range(500))), "")
    assert len(long.diff.splitlines()) == DIFF_MAX_LINES + 1 and long.diff.endswith("more lines")
