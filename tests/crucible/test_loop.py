"""Crucible's loop on real git worlds and a real JetStream session log, one test per behaviour."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from reel.services.crucible.world import git
from reel.shared.crucible.events import (
    CandidateApplied,
    CandidateDenied,
    Escalated,
    FingerprintChanged,
    IterationClosed,
    MeasureFinished,
    ParkEnded,
    ParkStarted,
    ProposalMade,
    ProvisioningBlocked,
    ProvisioningCleared,
    SegmentOpened,
    SessionEnded,
    normalized,
)
from reel.shared.crucible.state import Fate, InvalidReading, LoopExit, Segment, WorldSha
from reel.shared.runtime.config import Config
from tests.crucible.conftest import Crucible
from tests.crucible.fixtures import JUDGE, ONE_READING, make_config, make_repo, write


def verdicts(o: object) -> list[str]:
    return [r.verdict.value for r in o.state.run.rows]  # type: ignore[attr-defined]


async def head(world_dir: str) -> str:
    return (await git(Path(world_dir), "rev-parse", "HEAD")).strip()


async def test_finished_keeps_improvements_and_rolls_back_the_rest(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    o = await crucible.run(make_config(root, repo, [write(2), write(1.5), {"note": "nothing"}, write(3)]))
    assert o.exit is LoopExit.FINISHED and o.exit.exit_code == 3
    run = o.state.run
    assert verdicts(o) == ["keep", "discard", "skip", "keep"]
    assert [r.delta for r in run.rows] == [1.0, -0.5, None, 1.0]
    assert run.segment.best_score == 3.0 and run.segment.baseline_score == 1.0 and run.segment.baseline_total == 10
    world = o.state.started.world_dir
    assert await head(world) == run.segment.best_snap == run.rows[3].kept_sha
    assert run.kept_shas == (run.rows[0].kept_sha, run.rows[3].kept_sha)
    assert (Path(world) / "value.txt").read_text() == "3\n"
    discarded = run.rows[1].sha
    assert discarded and (await git(Path(world), "show", f"refs/crucible/{o.session_id}/2:value.txt")) == "1.5\n"
    assert (await git(Path(world), "rev-parse", f"refs/crucible/{o.session_id}/2")).strip() == discarded
    assert run.rows[2].reason.startswith("empty diff")
    made = [e for e in o.events if isinstance(e, ProposalMade)]
    assert [m.outcome for m in made] == ["candidate", "candidate", "empty", "candidate"]
    assert all(m.patch is not None for m in made if m.outcome == "candidate")


async def test_solved_when_the_goal_is_reached(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    cfg = make_config(root, repo, [write(2), write(3.5), write(9)], goal=3.0)
    o = await crucible.run(cfg)
    assert o.exit is LoopExit.SOLVED and o.exit.exit_code == 0
    assert verdicts(o) == ["keep", "keep"] and o.state.run.solved_any and o.state.run.rows[-1].goal_met


async def test_cost_budget_counts_failed_calls_and_stops_before_overshooting(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    plan = [write(2, cost_usd=0.4), {"note": "api error", "cost_usd": 0.4, "exit": 1}, write(5, cost_usd=0.4)]
    o = await crucible.run(make_config(root, repo, plan, budget={"iterations": 10, "cost_usd": 1.0}))
    assert o.exit is LoopExit.BUDGET and o.exit.exit_code == 4
    assert verdicts(o) == ["keep", "failed"]  # a third call could cost 1.2 > 1.0: not started
    assert o.state.run.spent.cost_usd == pytest.approx(0.8) and o.state.run.rows[1].cost_usd == pytest.approx(0.4)
    assert "cost budget" in o.state.ended.reason


async def test_escalation_by_the_proposer_rolls_back_and_needs_a_human(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    plan = [write(2), {"write": {"value.txt": "7\n"}, "escalate": "the spec is ambiguous"}]
    o = await crucible.run(make_config(root, repo, plan))
    assert o.exit is LoopExit.ESCALATED and o.exit.exit_code == 6 and o.state.run.outcome().escalated
    assert verdicts(o) == ["keep", "escalated"]
    assert [e.reason for e in o.of(Escalated)] == ["proposer escalated: the spec is ambiguous"]
    world = Path(o.state.started.world_dir)
    assert (world / "value.txt").read_text() == "2\n" and await head(str(world)) == o.state.run.segment.best_snap


async def test_stop_request_ends_at_the_next_gate(crucible: Crucible, root: Path, cfg: Config) -> None:
    """A stop set while iteration 2 is under way lets it finish and ends the run at gate 3."""
    repo = await make_repo(root, "1")
    started, gate = root / "it2-started", root / "it2-gate"
    hold = {"started": str(started), "gate": str(gate)}
    stop = asyncio.Event()
    task = asyncio.create_task(crucible.run(make_config(root, repo, [write(2), {**write(3), "hold": hold},
                                                                     write(4)]),
                                            session_id="stopme", stop=stop))
    while not await asyncio.to_thread(started.exists):  # rendezvous: iteration 2's proposer is running
        assert not task.done(), "the run ended before iteration 2 proposed"
        await asyncio.sleep(0.01)
    stop.set()
    gate.touch()
    o = await task
    assert o.exit is LoopExit.STOPPED and o.state.ended.reason == "stop requested"
    assert verdicts(o) == ["keep", "keep"]  # iteration 2 completed; iteration 3 never entered Proposed


async def test_park_time_is_excluded_from_the_time_budget(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    flag = root / "parked-once"
    probe = root / "probe.py"
    probe.write_text(textwrap.dedent(f"""
        import sys
        from pathlib import Path
        flag = Path({str(flag)!r})
        if not flag.exists():
            flag.write_text("x")
            print("waiting for the nightly backup")
            sys.exit(75)
    """))
    # the park (9 s) alone exceeds the budget (8 s); the active time stays well under it even on a loaded
    # 2-core machine (the measure tree and settle add git calls: with 5 s of budget an iteration of
    # ~2.4 s under load left no room for the next estimate)
    park = {"command": [sys.executable, str(probe)], "poll_s": 9.0}
    cfg = make_config(root, repo, [write(2), write(3)], budget={"iterations": 2, "wall_s": 8.0},
                      gates={"park": park, "retry_s": 0.05})
    o = await crucible.run(cfg)
    run = o.state.run
    assert o.exit is LoopExit.FINISHED, o.state.ended
    assert [e.reason for e in o.of(ParkStarted)] == ["waiting for the nightly backup"]
    parked_ms = o.of(ParkEnded)[0].parked_ms
    assert parked_ms >= 9000 and run.parked_total.total_seconds() * 1000 == parked_ms
    assert run.spent.wall_ms >= 9000 > 8000 > run.active_ms  # wall time alone would have broken the budget


async def test_rescope_opens_a_new_segment_in_one_event(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    hard_env = {"JUDGE_STATE": str(root / "judge-state"), "SCALE": "10", "TOTAL": "100"}
    regimes = [
        {"name": "easy", "goal": 2.0, "judge": {"command": ["{python}", "judge.py"], "direction": "maximize",
                                                "reads": ["judge.py"], "env": {"JUDGE_STATE": str(root / "js")}}},
        {"name": "hard", "goal": 60.0, "judge": {"command": ["{python}", "judge.py"], "direction": "maximize",
                                                 "reads": ["judge.py"], "env": hard_env}},
    ]
    cfg = make_config(root, repo, [write(2), write(4), write(7)], regimes=regimes, judge=None)
    o = await crucible.run(cfg)
    opened = o.of(SegmentOpened)
    assert [(e.regime, e.reason) for e in opened] == [("easy", "baseline"), ("hard", "rescope")]
    assert [r.regime for r in o.state.run.rows] == ["easy", "hard", "hard"]
    seg = o.state.run.segment
    rescope = opened[1]
    assert rescope.snap == o.state.run.rows[0].kept_sha and rescope.reading.score == 20.0
    assert seg.regime == "hard" and seg.baseline_total == 100 and seg.baseline_score == 20.0
    assert seg.fingerprint == rescope.fingerprint != opened[0].fingerprint
    assert seg == Segment.baseline(regime="hard", fingerprint=rescope.fingerprint, reading=rescope.reading,
                                   snap=WorldSha(rescope.snap)).promoted(70.0, WorldSha(o.state.run.rows[2].sha or ""))
    assert o.exit is LoopExit.SOLVED and o.state.run.solved_any


async def test_deny_refuses_a_judge_edit_before_apply(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    cheat = {"write": {"judge.py": "print(1e9)\n", "value.txt": "2\n"}, "note": "make the judge generous"}
    o = await crucible.run(make_config(root, repo, [cheat, write(5)]))
    assert o.exit is LoopExit.ESCALATED
    denial = o.of(CandidateDenied)[0]
    assert denial.paths == ("judge.py",) and "protected" in denial.reason
    assert not o.of(CandidateApplied) and not o.of(MeasureFinished)  # refused before apply, never measured
    assert verdicts(o) == ["denied"]
    world = Path(o.state.started.world_dir)
    assert (world / "judge.py").read_text() == JUDGE and (world / "value.txt").read_text() == "1\n"
    assert await head(str(world)) == o.state.started.base_sha
    assert (await git(world, "status", "--porcelain")) == ""

    skip = await crucible.run(make_config(root / "skip", await make_repo(root / "skip", "1"), [cheat, write(5)],
                                          gates={"on_deny": "skip", "retry_s": 0.05}))
    assert verdicts(skip) == ["denied", "keep"] and skip.exit is LoopExit.FINISHED


async def test_fingerprint_change_stops_the_run(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    data = root / "labels.txt"
    data.write_text("gold\n")
    tamper = {"write": {str(data): "gold, but easier\n", "value.txt": "9\n"}, "note": "edit the judge's data"}
    cfg = make_config(root, repo, [write(2), tamper, write(3)],
                      judge={"command": ["{python}", "judge.py"], "direction": "maximize",
                             "reads": ["judge.py", str(data)], "env": {"JUDGE_STATE": str(root / "js")}})
    o = await crucible.run(cfg)
    assert o.exit is LoopExit.STOPPED and o.exit.exit_code == 5
    changed = o.of(FingerprintChanged)[0]
    assert changed.it == 2 and changed.changed == (f"read:{data}",)
    assert verdicts(o) == ["keep", "abandoned"] and o.state.run.segment.best_score == 2.0
    assert len(o.of(MeasureFinished)) == 1  # iteration 2 was never measured against the moved goalpost
    assert (Path(o.state.started.world_dir) / "value.txt").read_text() == "2\n"


async def test_nan_inf_crash_missing_and_timeout_are_invalid_never_kept(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    plan = [write("nan"), write("inf"), write("crash"), write("missing"), write("timeout"), write(2)]
    cfg = make_config(root, repo, plan,
                      judge={"command": ["{python}", "judge.py"], "direction": "maximize", "reads": ["judge.py"],
                             "env": {"JUDGE_STATE": str(root / "js")}, "timeout_s": 1.0})
    o = await crucible.run(cfg)
    rows = o.state.run.rows
    assert verdicts(o) == ["invalid"] * 5 + ["keep"]
    reasons = [r.reason for r in rows[:5]]
    assert reasons[0] == "nan" and reasons[1] == "inf"
    assert reasons[2].startswith("crash: exit 1") and "on purpose" in reasons[2]
    assert reasons[3].startswith("missing value") and reasons[4] == "timeout after 1s"
    assert all(r.score is None and r.kept_sha is None and r.best_score == 1.0 for r in rows[:5])
    assert all(isinstance(e.reading, InvalidReading) for e in o.of(MeasureFinished)[:5])
    assert o.state.run.segment.best_score == 2.0


async def test_noisy_judge_with_noop_candidates_keeps_nothing(crucible: Crucible, root: Path) -> None:
    noop = [write(v, note=f"reformat as {v}") for v in ("1.0", "1.00", "01", "1.000", "+1", "1e0")]

    async def session(tag: str, k_sigma: float) -> list[str]:
        base = root / tag
        repo = await make_repo(base, "1")
        cfg = make_config(base, repo, noop, judge_env={"NOISE": "0.5"},
                          judge={"command": ["{python}", "judge.py"], "direction": "maximize", "repeats": 3,
                                 "reads": ["judge.py"], "env": {"JUDGE_STATE": str(base / "js"), "NOISE": "0.5"}},
                          noise={**ONE_READING, "k_sigma": k_sigma, "baseline_repeats": 5})
        return verdicts(await crucible.run(cfg))

    guarded = await session("guarded", 3.0)
    naive = await session("naive", 0.0)  # the same noise sequence, no margin
    assert guarded == ["discard"] * len(noop)
    assert "keep" in naive  # the judge is noisy enough to fool a margin-less loop


async def test_incumbent_is_remeasured_before_a_promotion(crucible: Crucible, root: Path) -> None:
    judge = {"command": ["{python}", "judge.py"], "direction": "maximize", "reads": ["judge.py"],
             "env": {"JUDGE_STATE": str(root / "js"), "DRIFT": "0.5"}}  # every reading 0.5 higher than the last

    async def session(tag: str, remeasure: bool) -> object:
        return await crucible.run(make_config(root / tag, await make_repo(root / tag, "1"), [write("1.0")],
                                              judge={**judge, "env": {**judge["env"], "JUDGE_STATE": str(root / tag)}},
                                              noise={**ONE_READING, "remeasure_incumbent": remeasure}))

    naive = await session("naive", False)
    assert verdicts(naive) == ["keep"]  # 1.5 after a 1.0 baseline: drift mistaken for progress
    o = await session("checked", True)
    row = o.state.run.rows[0]  # type: ignore[attr-defined]
    assert [(e.target, e.reading.score) for e in o.of(MeasureFinished)] == [("candidate", 1.5), ("incumbent", 2.0)]
    assert row.verdict is Fate.DISCARD and row.incumbent == (2.0,) and row.score == 1.5
    assert (Path(o.state.started.world_dir) / "value.txt").read_text() == "1\n"  # type: ignore[attr-defined]


async def test_unavailable_judge_parks_the_iteration_instead_of_discarding(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    o = await crucible.run(make_config(root, repo, [write("tempfail 2 5")]))
    blocked = o.of(ProvisioningBlocked)
    assert [(b.it, b.resource, b.reason) for b in blocked] == [(1, "judge", "gpu pool empty")] * 2
    assert len(o.of(ProvisioningCleared)) == 1 and o.state.run.pending_block is None
    assert verdicts(o) == ["keep"] and o.state.run.segment.best_score == 5.0
    assert o.state.run.parked_total.total_seconds() > 0


async def test_resume_twice_is_idempotent(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    o = await crucible.run(make_config(root, repo, [write(2), write(0)]))
    again = await crucible.resume(o.session_id)
    twice = await crucible.resume(o.session_id)
    assert o.exit is again.exit is twice.exit is LoopExit.FINISHED
    assert again.events == twice.events == o.events and again.state == o.state


async def test_rerun_gives_an_identical_log_and_exit(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    plan = [write(2), write(1), {"note": "x", "cost_usd": 0.1, "exit": 3}, write("nan"), write(4), {"note": "noop"}]
    cfg = make_config(root, repo, plan)
    first, second = await crucible.run(cfg, session_id="rerun-a"), await crucible.run(cfg, session_id="rerun-b")
    drop = frozenset({"at_ms", "wall_ms", "judge_ms", "proposer_ms", "parked_ms", "waited_ms", "since_ms",
                      "session_id", "world_dir"})
    assert first.exit is second.exit is LoopExit.FINISHED
    assert normalized(first.events, drop=drop) == normalized(second.events, drop=drop)
    assert first.state.run.kept_shas == second.state.run.kept_shas  # deterministic world commits


async def test_model_proposer_through_reel_adapters(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    diff = "NOTE: raise the value\n```diff\n--- a/value.txt\n+++ b/value.txt\n@@ -1 +1 @@\n-1\n+2\n```\n"
    outputs = [diff, "this is not a diff", "ESCALATE: I need the test data"]
    cfg = make_config(root, repo, [], proposer={"model": {"adapter": "scripted", "outputs": outputs}},
                      budget={"iterations": 5})
    o = await crucible.run(cfg)
    assert verdicts(o) == ["keep", "failed", "escalated"] and o.exit is LoopExit.ESCALATED
    assert o.state.run.rows[0].note == "raise the value" and o.state.run.segment.best_score == 2.0
    assert all(e.prompt is not None for e in o.of(ProposalMade))


async def test_live_state_equals_a_cold_refold(crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    o = await crucible.run(make_config(root, repo, [write(2), write("crash"), write(3)]))
    assert o.live == o.state  # the loop's Run is the fold of what it committed, byte for byte
    assert msgspec.json.encode(o.live) == msgspec.json.encode(o.state)
    assert [c.row for c in o.of(IterationClosed)] == list(o.state.run.rows)
    assert isinstance(o.events[-1], SessionEnded) and o.state.run.exit is LoopExit.FINISHED
    assert o.state.run.spent.iterations == 3
