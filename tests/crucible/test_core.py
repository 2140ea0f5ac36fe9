"""Crucible's pure core: exit mapping, the segment swap, decide, budgets, fold, codecs (no server)."""

from __future__ import annotations

import msgspec
import pytest
from msgspec.structs import replace

from reel.shared.core.errors import UnknownEventType
from reel.shared.crucible import budget
from reel.shared.crucible.config import BudgetSpec, NoiseSpec, SessionConfig, parse_config
from reel.shared.crucible.errors import ConfigInvalid
from reel.shared.crucible.events import (
    IterationClosed,
    ProposalMade,
    SegmentOpened,
    SessionCommit,
    SessionEnded,
    SessionStarted,
    decode_session_commit,
    encode_session_commit,
    normalized,
)
from reel.shared.crucible.fold import fold
from reel.shared.crucible.iteration import CandidateChange, Iteration
from reel.shared.crucible.state import (
    EXIT_CODES,
    Fate,
    InvalidReading,
    LoopExit,
    Reading,
    Row,
    Run,
    Segment,
    Spent,
    WorldSha,
)

CFG = parse_config({
    "world": {"repo": "/src"}, "judge": {"command": ["j"], "direction": "maximize"}, "proposer": {"command": ["p"]},
}, config_dir="/cfg", cwd="/cwd", environ={})


def seg(score: float = 1.0, **kw: object) -> Segment:
    base = Segment.baseline(regime="a", fingerprint="f1", reading=Reading(values=(score,), score=score, total=10),
                            snap=WorldSha("s1"))
    return replace(base, **kw)


def test_each_loop_exit_has_one_distinct_documented_exit_code() -> None:
    assert {e: e.exit_code for e in LoopExit} == {
        LoopExit.SOLVED: 0, LoopExit.FINISHED: 3, LoopExit.BUDGET: 4, LoopExit.STOPPED: 5, LoopExit.ESCALATED: 6,
    }
    assert set(EXIT_CODES) == set(LoopExit) and len(set(EXIT_CODES.values())) == len(LoopExit)
    assert not {1, 2} & set(EXIT_CODES.values())  # generic error / usage stay free
    for e in LoopExit:
        out = replace(Run(segment=seg()), exit=e, exit_reason="r").outcome()
        assert (out.exit, out.exit_code, out.escalated) == (e, e.exit_code, e is LoopExit.ESCALATED)
    assert [e for e in LoopExit if not e.terminal] == [LoopExit.STOPPED]


def test_rescope_replaces_every_segment_field_in_one_assignment() -> None:
    started = SessionStarted(session_id="s", config=CFG, base_sha="s0", world_dir="/w", protected=(), at_ms=0)
    first = SegmentOpened(regime="easy", reason="baseline", fingerprint="fp-easy", fingerprint_parts={},
                          reading=Reading(values=(1.0, 1.2), score=1.1, total=10), snap="s0", wall_ms=1, at_ms=1)
    keep = IterationClosed(row=Row(it=1, regime="easy", verdict=Fate.KEEP, readings=(3.0, 2.0, 2.0), selecting=1,
                                   score=7 / 3, best_score=2.0, sha="s1", kept_sha="s1"), at_ms=2)
    rescope = SegmentOpened(regime="hard", reason="rescope", fingerprint="fp-hard", fingerprint_parts={},
                            reading=Reading(values=(7.0,), score=7.0, total=99), snap="s9", wall_ms=1, at_ms=3)
    commits = [(1, SessionCommit(commit_id="c1", session_id="s", events=(started, first))),
               (2, SessionCommit(commit_id="c2", session_id="s", events=(keep,)))]
    before = fold(commits)
    assert before is not None and before.run is not None
    after = fold([*commits, (3, SessionCommit(commit_id="c3", session_id="s", events=(rescope,)))])
    assert after is not None and after.run is not None
    old, new = before.run.segment, after.run.segment
    assert new == Segment.baseline(regime="hard", fingerprint="fp-hard", reading=rescope.reading, snap=WorldSha("s9"))
    for name in Segment.__struct_fields__:
        assert getattr(old, name) != getattr(new, name), name  # every field replaced, none half-updated
    assert after.run.rows == before.run.rows and after.run.kept_shas == ("s1",)  # run state outside the segment kept


def test_decide_keeps_only_a_valid_reading_beyond_the_margin() -> None:
    cand = CandidateChange(note="n", paths=("x",))
    applied = Iteration.propose(1, "a", cand).apply(WorldSha("c1"))
    noise = NoiseSpec(abs_margin=0.5)
    kw = {"segment": seg(1.0), "direction": "maximize", "noise": noise, "goal": 1.4, "wall_ms": 5}
    assert applied.measure(Reading(values=(1.6,), score=1.6)).decide(**kw).verdict is Fate.KEEP  # type: ignore[arg-type]
    small = applied.measure(Reading(values=(1.4,), score=1.4)).decide(**kw)  # type: ignore[arg-type]
    assert small.verdict is Fate.DISCARD and small.kept is None and small.row.best_score == 1.0
    bad = applied.measure(InvalidReading(reason="nan", values=(9.0,))).decide(**kw)  # type: ignore[arg-type]
    assert bad.verdict is Fate.INVALID and bad.row.score is None and bad.row.readings == (9.0, None)
    kept = applied.measure(Reading(values=(3.0,), score=3.0)).decide(**kw)  # type: ignore[arg-type]
    assert kept.kept == Reading(values=(3.0,), score=3.0) and kept.row.goal_met and kept.row.kept_sha == "c1"
    down = applied.measure(Reading(values=(0.2,), score=0.2)).decide(**{**kw, "direction": "minimize"})  # type: ignore[arg-type]
    assert down.verdict is Fate.KEEP  # direction is configured, never inferred


def test_k_sigma_margin_uses_the_repeated_baseline() -> None:
    s = seg(1.0, baseline_readings=(0.8, 1.0, 1.2))  # σ = 0.2
    applied = Iteration.propose(1, "a", CandidateChange(note="n", paths=("x",))).apply(WorldSha("c"))
    noise = NoiseSpec(k_sigma=3.0, baseline_repeats=3)
    kw = {"segment": s, "direction": "maximize", "noise": noise, "goal": None, "wall_ms": 0}
    assert applied.measure(Reading(values=(1.55,), score=1.55)).decide(**kw).verdict is Fate.DISCARD  # type: ignore[arg-type]
    assert applied.measure(Reading(values=(1.65,), score=1.65)).decide(**kw).verdict is Fate.KEEP  # type: ignore[arg-type]


def test_promotes_is_decides_keep_test_against_the_recorded_best() -> None:
    applied = Iteration.propose(1, "a", CandidateChange(note="n", paths=("x",))).apply(WorldSha("c"))
    for direction in ("maximize", "minimize"):
        for noise in (NoiseSpec(abs_margin=0.5), NoiseSpec(k_sigma=3.0, baseline_repeats=3)):
            s = seg(1.0, baseline_readings=(0.8, 1.0, 1.2))
            for reading in (Reading(values=(v,), score=v) for v in (0.2, 0.5, 0.9, 1.0, 1.4, 1.5, 1.6, 1.65, 3.0)):
                measured = applied.measure(reading)
                decided = measured.decide(segment=s, direction=direction, noise=noise, goal=None,  # type: ignore[arg-type]
                                          wall_ms=0)
                assert measured.promotes(segment=s, direction=direction, noise=noise) is (  # type: ignore[arg-type]
                    decided.verdict is Fate.KEEP), (direction, noise, reading.score)
    invalid = applied.measure(InvalidReading(reason="nan", values=(9.0,)))
    assert not invalid.promotes(segment=seg(1.0), direction="maximize", noise=NoiseSpec())


def test_budget_stops_before_overshooting() -> None:
    rows = (Row(it=1, regime="a", verdict=Fate.DISCARD, best_score=1, cost_usd=0.4, wall_ms=300),)
    run = Run(segment=seg(), rows=rows, spent=Spent(iterations=1, cost_usd=0.4, wall_ms=400))
    assert budget.exhausted(run, BudgetSpec(iterations=5, cost_usd=1.0)) is None  # 0.4 + 0.4 ≤ 1.0
    run2 = replace(run, spent=Spent(iterations=2, cost_usd=0.8, wall_ms=700))
    exit_, why = budget.exhausted(run2, BudgetSpec(iterations=5, cost_usd=1.0)) or (None, "")
    assert exit_ is LoopExit.BUDGET and "cost" in why  # 0.8 + 0.4 would overshoot 1.0
    assert budget.exhausted(run2, BudgetSpec(iterations=2))[0] is LoopExit.FINISHED  # type: ignore[index]
    assert budget.exhausted(run2, BudgetSpec(iterations=9, wall_s=0.9))[0] is LoopExit.BUDGET  # type: ignore[index]
    assert budget.exhausted(run2, BudgetSpec(iterations=9, wall_s=1.0)) is None  # 0.7 + 0.3 ≤ 1.0


def test_session_commit_round_trip_and_unknown_event_is_an_error() -> None:
    events = (ProposalMade(it=1, outcome="empty", at_ms=5),
              SessionEnded(exit=LoopExit.BUDGET, reason="r", at_ms=6))
    commit = SessionCommit(commit_id="c", session_id="s", events=events)
    assert decode_session_commit(encode_session_commit(commit)) == commit
    bogus = encode_session_commit(commit).replace(b'"proposal_made"', b'"made_up"')
    with pytest.raises(UnknownEventType, match="made_up"):
        decode_session_commit(bogus)
    assert normalized(list(events)) == [
        {"type": "proposal_made", "it": 1, "outcome": "empty", "note": "", "paths": [], "diffstat": "",
         "patch": None, "prompt": None, "cost_usd": 0.0, "detail": "", "proposer_sha": ""},
        {"type": "session_ended", "exit": "budget", "reason": "r"},
    ]


def test_config_direction_is_required_and_paths_resolve() -> None:
    with pytest.raises(ConfigInvalid, match="direction"):
        parse_config({"world": {"repo": "."}, "judge": {"command": ["j"]}, "proposer": {"command": ["p"]}},
                     config_dir="/c", cwd="/w", environ={})
    cfg: SessionConfig = parse_config({
        "world": {"repo": "${CONFIG_DIR}/../src"},
        "judge": {"command": ["j"], "direction": "minimize", "env": {"DATA": "${DATA:-${CONFIG_DIR}/../data}"},
                  "reads": ["judge.py", "${DATA}"]},
        "proposer": {"command": ["p"]},
    }, config_dir="/c/cfg", cwd="/w", environ={})
    assert cfg.world.repo == "/c/src" and cfg.world.workdir == "/w/.reel/crucible"
    assert cfg.regimes[0].judge.env == {"DATA": "/c/data"} and cfg.regimes[0].judge.reads == ("judge.py", "/c/data")
    assert msgspec.json.decode(msgspec.json.encode(cfg), type=SessionConfig) == cfg


def test_confirmation_all_rule_and_the_incumbent_correction() -> None:
    applied = Iteration.propose(1, "a", CandidateChange(note="n", paths=("x",))).apply(WorldSha("c"))
    noise = NoiseSpec()  # defaults: confirm 3, re-measure the incumbent, rule "all"
    lucky = applied.measure(Reading(values=(2.0,), score=2.0))
    s = seg(1.0)
    assert lucky.promotes(segment=s, direction="maximize", noise=noise)
    corrected = s.remeasured((1.0, 0.98, 1.02))  # what the fold does with each incumbent reading
    assert corrected.best_score == 1.0 and corrected.best_readings == (1.0, 1.0, 0.98, 1.02)
    conf = Reading(values=(1.01, 0.99, 1.03), score=1.01)
    d = lucky.decide(segment=corrected, direction="maximize", noise=noise, goal=None, wall_ms=0,
                     incumbent=Reading(values=(1.0, 0.98, 1.02), score=1.0), confirmation=conf)
    assert d.verdict is Fate.DISCARD and d.row.readings == (2.0, 1.01, 0.99, 1.03) and d.row.best_score == 1.0
    assert d.row.incumbent == (1.0, 0.98, 1.02)
    assert "each of the candidate's 4 reading(s) must beat each of the best's 4" in d.row.reason
    better = applied.measure(Reading(values=(1.5,), score=1.5)).decide(
        segment=corrected, direction="maximize", noise=noise, goal=None, wall_ms=0,
        confirmation=Reading(values=(1.4, 1.6, 1.5), score=1.5))
    assert better.kept is not None and better.kept.values == (1.5, 1.4, 1.6, 1.5) and better.row.best_score == 1.5
    mean = NoiseSpec(confirm_rule="mean")  # the mean of the candidate against the corrected score
    assert lucky.decide(segment=corrected, direction="maximize", noise=mean, goal=None, wall_ms=0,
                        confirmation=conf).verdict is Fate.KEEP  # (2.0 + 3.03) / 4 > 1.0
    broken = lucky.decide(segment=corrected, direction="maximize", noise=noise, goal=None, wall_ms=0,
                          confirmation=InvalidReading(reason="nan", values=(1.0,)))
    assert broken.verdict is Fate.INVALID and broken.row.reason == "confirmation: nan"
    assert broken.row.readings == (2.0, 1.0, None)
    assert seg(1.0).promoted(1.5, WorldSha("k"), (1.4, 1.6)).best_readings == (1.4, 1.6)


def test_a_proposer_and_park_probe_get_the_base_environment_and_their_pass_env_and_nats_names_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from reel.services.crucible import proc
    monkeypatch.setenv("REEL_NATS_PASSWORD", "pw-not-for-tools")
    monkeypatch.setenv("PROPOSER_KEY", "k")
    env = proc.base_env(("PROPOSER_KEY", "REEL_NATS_PASSWORD"))
    assert env["PROPOSER_KEY"] == "k" and "REEL_NATS_PASSWORD" not in env
    assert set(env) - {"PROPOSER_KEY"} <= {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT"}
    base = {"world": {"repo": "/src"}, "judge": {"command": ["j"], "direction": "maximize"}}
    cfg = parse_config({**base, "proposer": {"command": ["p"], "pass_env": ["PROPOSER_KEY"]},
                        "gates": {"park": {"command": ["probe"], "pass_env": ["PROBE_TOKEN"]}}},
                       config_dir="/c", cwd="/w", environ={})
    assert cfg.proposer.pass_env == ("PROPOSER_KEY",) and cfg.gates.park is not None
    assert cfg.gates.park.pass_env == ("PROBE_TOKEN",)
    for bad, at in (({"proposer": {"command": ["p"], "pass_env": ["REEL_NATS_USER"]}}, "proposer.pass_env[0]"),
                    ({"proposer": {"command": ["p"]}, "gates": {"park": {"command": ["x"],
                                                                         "pass_env": ["REEL_NATS_CREDS"]}}},
                     "gates.park.pass_env[0]"),
                    ({"proposer": {"command": ["p"]}, "judge": {**base["judge"], "env": {"REEL_NATS_TOKEN": "t"}}},
                     "regime main: judge.env.REEL_NATS_TOKEN")):
        with pytest.raises(ConfigInvalid, match=r"NATS credentials") as exc:
            parse_config({**base, **bad}, config_dir="/c", cwd="/w", environ={})
        assert f"(at `{at}`)" in exc.value.message


def test_the_reading_that_selected_the_best_does_not_estimate_it() -> None:
    """A candidate (true 9, minimize) read a lucky 5 first: kept on 5, 9, 9, 9 its best is 9, not the mean 8 that
    stood on the 5; a later candidate truly at 8 is kept — before, it was discarded ("improvement -3")."""
    noise = NoiseSpec()  # defaults: confirm 3, re-measure the incumbent, rule "all"
    base = replace(seg(10.0), best_readings=(10.0, 10.0, 10.0))
    first = Iteration.propose(1, "a", CandidateChange(note="lucky", paths=("x",))).apply(WorldSha("c1"))
    lucky = first.measure(Reading(values=(5.0,), score=5.0))
    assert lucky.promotes(segment=base, direction="minimize", noise=noise)
    kept = lucky.decide(segment=base, direction="minimize", noise=noise, goal=None, wall_ms=0,
                        confirmation=Reading(values=(9.0, 9.0, 9.0), score=9.0))
    assert kept.verdict is Fate.KEEP and kept.row.readings == (5.0, 9.0, 9.0, 9.0) and kept.row.selecting == 1
    assert kept.row.best_score == 9.0 and kept.row.score == 8.0  # the row's score is every value; the best is not
    s = base.promoted(8.0, WorldSha("c1"), kept.row.readings, kept.row.selecting)  # what the fold does
    assert s.best_score == 9.0 and s.best_readings == (5.0, 9.0, 9.0, 9.0)
    nxt = Iteration.propose(2, "a", CandidateChange(note="better", paths=("x",))).apply(WorldSha("c2"))
    truly_better = nxt.measure(Reading(values=(8.0,), score=8.0))
    assert truly_better.promotes(segment=s, direction="minimize", noise=noise)
    s = s.remeasured((9.0,))  # the incumbent measured again while confirming: still 9, the 5 still left out
    assert s.best_score == 9.0
    d = truly_better.decide(segment=s, direction="minimize", noise=noise, goal=None, wall_ms=0,
                            confirmation=Reading(values=(8.0, 8.0, 8.0), score=8.0))
    assert d.verdict is Fate.KEEP and d.row.best_score == 8.0
    worse = nxt.measure(Reading(values=(9.5,), score=9.5)).decide(segment=s, direction="minimize", noise=noise,
                                                                  goal=None, wall_ms=0)
    assert worse.verdict is Fate.DISCARD
    assert worse.row.reason == ("its worst reading 9.5 is not better than the best's best reading 9 by more than the "
                                "margin 0 (improvement -0.5; rule \"all\": each of the candidate's 1 reading(s) must "
                                "beat each of the best's 4; better = lower)")
