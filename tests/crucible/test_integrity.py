"""On real git, real processes and the JetStream session log: the world holds exactly what was
measured, and a lucky reading cannot crown a candidate."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reel.services.crucible.world import git
from reel.shared.crucible.events import MeasureFinished, ProposalMade
from reel.shared.crucible.state import Fate, LoopExit
from tests.crucible.conftest import Crucible
from tests.crucible.fixtures import JUDGE, make_config, make_repo, write


def verdicts(o: object) -> list[str]:
    return [r.verdict.value for r in o.state.run.rows]  # type: ignore[attr-defined]


async def out(world: Path, *args: str) -> str:
    return (await git(world, *args)).strip()


async def test_a_proposers_own_commit_of_a_protected_file_is_denied_and_rolled_back(crucible: Crucible,
                                                                                     root: Path) -> None:
    """A proposer that commits a tampered judge got "skip — empty diff" and kept its commit."""
    repo = await make_repo(root, "1")
    tamper = {"write": {"judge.py": "print(1e9)\n"}, "commit": "tune the judge", "note": "tamper"}
    o = await crucible.run(make_config(root, repo, [tamper, tamper], gates={"on_deny": "skip", "retry_s": 0.05}))
    assert verdicts(o) == ["denied", "denied"] and o.exit is LoopExit.FINISHED
    made = o.of(ProposalMade)
    assert [m.paths for m in made] == [("judge.py",), ("judge.py",)]  # the gate saw the committed change
    world, base = Path(o.state.started.world_dir), o.state.started.base_sha
    assert await out(world, "rev-parse", "HEAD") == base == await out(world, "rev-parse", f"crucible/{o.session_id}")
    assert await out(world, "symbolic-ref", "HEAD") == f"refs/heads/crucible/{o.session_id}"
    assert (world / "judge.py").read_text() == JUDGE and await out(world, "status", "--porcelain") == ""
    for m in made:  # the proposer's commit is off the branch but kept under the iteration's ref
        ref = f"refs/crucible/{o.session_id}/proposer/{m.it}"
        assert m.proposer_sha and await out(world, "rev-parse", ref) == m.proposer_sha
        assert await out(world, "show", f"{ref}:judge.py") == "print(1e9)"
    assert await out(world, "branch", "--contains", made[0].proposer_sha) == ""


async def test_a_committed_change_is_part_of_the_candidate_its_diffstat_and_its_rollback(crucible: Crucible,
                                                                                         root: Path) -> None:
    """A committed parameter change rode into a kept sha whose diffstat showed only another file."""
    repo = await make_repo(root, "1")
    plan = [{"write": {"value.txt": "5\n"}, "commit": "raise", "write_after": {"notes.txt": "why\n"}, "note": "c"},
            {"write": {"value.txt": "0\n"}, "commit": "lower", "note": "worse"},
            {"write": {"value.txt": "0\n"}, "commit": "lower", "write_after": {"scratch.txt": "x\n"},
             "note": "worse, with an untracked file", "exit": 1}]
    o = await crucible.run(make_config(root, repo, plan))
    assert verdicts(o) == ["keep", "discard", "failed"]
    made = o.of(ProposalMade)
    assert made[0].paths == ("notes.txt", "value.txt") and made[0].diffstat.startswith("2 files changed")
    world, base = Path(o.state.started.world_dir), o.state.started.base_sha
    kept = o.state.run.rows[0].kept_sha
    assert kept and await out(world, "rev-parse", f"{kept}^") == base  # one candidate commit on the best snapshot
    assert (await out(world, "diff", "--name-only", base, kept)).split() == ["notes.txt", "value.txt"]
    assert made[1].paths == ("value.txt",) and o.state.run.rows[1].score == 0.0
    # every non-keep restored the best snapshot exactly: branch, tracked and untracked files
    assert await out(world, "rev-parse", "HEAD") == kept == o.state.run.segment.best_snap
    assert (world / "value.txt").read_text() == "5\n" and not (world / "scratch.txt").exists()
    assert await out(world, "status", "--porcelain", "--ignored") == ""
    for it in (2, 3):
        ref = f"refs/crucible/{o.session_id}/proposer/{it}"
        assert await out(world, "show", f"{ref}:value.txt") == "0" and made[it - 1].proposer_sha


JUDGE_IMPORTING = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, ".")
    import param  # compiled to __pycache__/ next to it, as any Python judge does
    with open("judge.log", "a") as f:
        f.write(f"measured {param.X}\\n")
    print(json.dumps({"score": param.X}))
''')


async def test_the_judge_measures_a_clean_tree_and_its_leftovers_never_enter_a_candidate(crucible: Crucible,
                                                                                         root: Path) -> None:
    """The judge's bytecode cache and log became part of the next candidate; a stale cache
    (a proposer that keeps mtimes) made the judge measure the previous code."""
    repo = await make_repo(root, "1")
    (repo / "param.py").write_text("X = 1\n")
    (repo / "judge2.py").write_text(JUDGE_IMPORTING)
    await git(repo, "add", "-A")
    await git(repo, "commit", "-q", "-m", "param")
    plan = [{"write": {"param.py": "X = 2\n"}, "keep_mtime": True, "note": "same size, same mtime"},
            {"write": {"param.py": "X = 30\n"}, "note": "thirty"},
            {"write": {"param.py": "X = 40\n"}, "note": "forty"}]
    judge = {"command": ["{python}", "judge2.py"], "direction": "maximize", "reads": ["judge2.py"]}
    o = await crucible.run(make_config(root, repo, plan, judge=judge))
    assert verdicts(o) == ["keep", "keep", "keep"], o.state.run.rows  # the judge measured the code it was given
    assert [r.score for r in o.state.run.rows] == [2.0, 30.0, 40.0]
    assert [m.paths for m in o.of(ProposalMade)] == [("param.py",)] * 3
    world = Path(o.state.started.world_dir)
    tracked = (await out(world, "ls-tree", "-r", "--name-only", o.state.run.segment.best_snap)).split()
    assert tracked == ["judge.py", "judge2.py", "param.py", "value.txt"]
    assert not (world / "judge.log").exists() and not (world / "__pycache__").exists()
    measure = world.parent / "measure"  # judge artifacts stay in the measure tree, until the next measurement
    assert (measure / "judge.log").read_text() == "measured 40\n" and (measure / "__pycache__").is_dir()


async def test_a_lucky_reading_is_confirmed_before_a_keep_and_the_incumbent_corrected(crucible: Crucible,
                                                                                      root: Path) -> None:
    """With remeasure_incumbent, one lucky reading crowned a no-op for good and every truly better
    candidate after it was discarded. The judge here spikes +1.0 once, on its second call."""
    repo = await make_repo(root, "1")
    plan = [write("1.0", note="no-op"), write(1.5), write(1.6)]
    env = {"JUDGE_STATE": str(root / "js"), "SPIKE_AT": "1"}
    spiky = JUDGE.replace('print(json.dumps({"score": (float(kind) + jitter) * scale,',
                          'jitter += 1.0 if str(n) == os.environ.get("SPIKE_AT") else 0.0\n'
                          '    print(json.dumps({"score": (float(kind) + jitter) * scale,')
    assert spiky != JUDGE
    (repo / "judge.py").write_text(spiky)
    await git(repo, "commit", "-q", "-am", "spiky judge")
    cfg = make_config(root, repo, plan, noise={"remeasure_incumbent": True},  # the report's settings
                      judge={"command": ["{python}", "judge.py"], "direction": "maximize", "reads": ["judge.py"],
                             "env": env})
    o = await crucible.run(cfg)
    rows = o.state.run.rows
    assert verdicts(o) == ["discard", "keep", "keep"]
    assert rows[0].readings == (2.0, 1.0, 1.0, 1.0) and rows[0].incumbent == (1.0, 1.0, 1.0)
    assert rows[0].best_score == 1.0
    assert "each of the candidate's 4 reading(s) must beat each of the best's 4" in rows[0].reason
    first = [e for e in o.of(MeasureFinished) if e.it == 1]
    assert [e.target for e in first] == ["candidate"] + ["incumbent", "candidate"] * 3  # alternately
    assert rows[2].score == 1.6 and o.state.run.segment.best_score == pytest.approx(1.6)
    assert o.state.run.segment.best_readings == (1.6,) * 4  # the kept reading is its four values
    assert rows[2].verdict is Fate.KEEP and rows[1].incumbent == (1.0,) * 3


async def test_a_noisy_judge_keeps_no_noop_over_30_iterations_at_default_settings(crucible: Crucible,
                                                                                  root: Path) -> None:
    """The closing note's figure: a ±5 % uniform judge, 30 no-op reformattings, every noise setting default."""
    repo = await make_repo(root, "1")
    spellings = ["1", "1.0", "1.00", "01", "+1", "1e0", "1.000", "10e-1", "0.1e1", "001"]
    plan = [write(spellings[i % len(spellings)] + " " * (i // len(spellings)), note=f"reformat {i}")
            for i in range(1, 31)]
    cfg = make_config(root, repo, plan, noise=None, judge_env={"NOISE": "0.05"})  # noise=None: the defaults
    assert cfg.noise.confirm_repeats == 3 and cfg.noise.remeasure_incumbent and cfg.noise.confirm_rule == "all"
    o = await crucible.run(cfg)
    rows = o.state.run.rows
    assert len(rows) == 30 and all(r.verdict in (Fate.DISCARD, Fate.SKIP) for r in rows), [r.verdict for r in rows]
    confirmed = [r for r in rows if r.incumbent]
    assert confirmed  # some first readings were lucky: they were confirmed, and none survived it
    assert o.state.run.segment.best_snap == o.state.started.base_sha and not o.state.run.kept_shas


LUCKY_JUDGE = textwrap.dedent('''
    import json, os
    from pathlib import Path
    state = Path(os.environ["JUDGE_STATE"])
    state.mkdir(parents=True, exist_ok=True)
    calls = state / "calls"
    n = int(calls.read_text()) if calls.exists() else 0
    calls.write_text(str(n + 1))
    true = float(Path("value.txt").read_text())
    print(json.dumps({"score": 5.0 if str(n) == os.environ["LUCKY_AT"] else true}))
''')


async def test_a_truly_better_candidate_after_a_lucky_incumbent_is_kept(crucible: Crucible, root: Path) -> None:
    """Minimize; the judge reads the true score from ``value.txt`` but answers a lucky 5 on its second call
    (the first candidate's first reading). That candidate (true 9) is kept on 5, 9, 9, 9; the next one, truly
    8, was discarded because the incumbent's estimate still stood on the 5 that selected it."""
    repo = await make_repo(root, "10")
    (repo / "lucky.py").write_text(LUCKY_JUDGE)
    await git(repo, "add", "-A")
    await git(repo, "commit", "-q", "-m", "lucky judge")
    plan = [write(9, note="truly 9"), write(8, note="truly 8"), write(8.5, note="truly 8.5")]
    judge = {"command": ["{python}", "lucky.py"], "direction": "minimize", "reads": ["lucky.py"],
             "env": {"JUDGE_STATE": str(root / "js"), "LUCKY_AT": "1"}}
    o = await crucible.run(make_config(root, repo, plan, noise={"remeasure_incumbent": True}, judge=judge))
    rows = o.state.run.rows
    assert verdicts(o) == ["keep", "keep", "discard"], [(r.verdict, r.readings, r.reason) for r in rows]
    assert rows[0].readings == (5.0, 9.0, 9.0, 9.0) and rows[0].best_score == 9.0  # the lucky 5 selected, no more
    assert rows[1].readings == (8.0,) * 4 and rows[1].incumbent == (9.0,) * 3 and rows[1].best_score == 8.0
    assert o.state.run.segment.best_score == 8.0 and o.state.run.segment.best_snap == rows[1].kept_sha
    assert rows[2].reason == ("its worst reading 8.5 is not better than the best's best reading 8 by more than the "
                              "margin 0 (improvement -0.5; rule \"all\": each of the candidate's 1 reading(s) must "
                              "beat each of the best's 3; better = lower)")
