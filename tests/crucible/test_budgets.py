"""Budgets hold, on real processes and the JetStream session log — a call's reported cost
counts whatever its exit, a declared per-call cap keeps the cost cap, the proposer is told what is left, and
waits for an unavailable judge are parked time."""

from __future__ import annotations

import json
import os
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reel.services.crucible.session import backend
from reel.services.crucible.world import git
from reel.shared.crucible.config import SessionConfig, parse_config
from reel.shared.crucible.events import MeasureFinished, ProposalMade, ProvisioningBlocked, SegmentOpened
from reel.shared.crucible.state import InvalidReading, LoopExit
from reel.shared.runtime.config import Config
from tests.crucible.conftest import Crucible
from tests.crucible.fixtures import config_dict, make_config, make_repo, write


def with_proposer(root: Path, repo: Path, plan: list[dict[str, Any]], proposer: dict[str, Any],
                  **over: Any) -> SessionConfig:
    """The tiny world's config with ``proposer`` settings added to its plan proposer."""
    data = config_dict(root, repo, plan, **over)
    data["proposer"].update(proposer)
    return parse_config(data, config_dir=str(root), cwd=str(root), environ=os.environ)


def verdicts(o: object) -> list[str]:
    return [r.verdict.value for r in o.state.run.rows]  # type: ignore[attr-defined]


PAID_JUDGE = textwrap.dedent('''
    import json, time
    from pathlib import Path
    value = Path("value.txt").read_text().strip()
    print(json.dumps({"cost_usd": 0.25}), flush=True)  # billed before it knows the answer
    if value == "slow":
        time.sleep(60)
    print(json.dumps({"score": float(value), "cost_usd": 0.25}))
''')


async def test_costs_printed_before_a_timeout_are_counted_for_proposer_and_judge(crucible: Crucible,
                                                                                 root: Path) -> None:
    repo = await make_repo(root, "1")
    (repo / "paid.py").write_text(PAID_JUDGE)
    await git(repo, "add", "-A")
    await git(repo, "commit", "-q", "-m", "paid judge")
    plan = [{**write(2), "cost_usd": 0.5, "note": "then hung", "sleep": 60},  # proposer timeout after its cost
            write("slow", cost_usd=0.1)]  # the judge prints a cost, then times out
    cfg = with_proposer(root, repo, plan, {"timeout_s": 2.0}, judge={
        "command": ["{python}", "paid.py"], "direction": "maximize", "reads": ["paid.py"], "timeout_s": 2.0})
    o = await crucible.run(cfg)
    rows = o.state.run.rows
    assert verdicts(o) == ["failed", "invalid"]
    assert rows[0].note == "then hung" and "timed out" in rows[0].reason and rows[0].cost_usd == pytest.approx(0.5)
    reading = o.of(MeasureFinished)[0].reading
    assert isinstance(reading, InvalidReading) and reading.reason.startswith("timeout")
    assert reading.cost_usd == pytest.approx(0.25) and rows[1].cost_usd == pytest.approx(0.35)
    baseline = o.of(SegmentOpened)[0].reading
    assert baseline.cost_usd == pytest.approx(0.25)  # the baseline's judge call is billed too
    assert o.state.run.spent.cost_usd == pytest.approx(0.25 + 0.5 + 0.1 + 0.25)


async def test_a_declared_call_cap_keeps_the_cost_cap_and_the_proposer_is_told_what_is_left(
        crucible: Crucible, root: Path) -> None:
    repo = await make_repo(root, "1")
    seen = [root / f"env{i}.json" for i in (1, 2, 3)]
    plan = [write(2, cost_usd=0.1, record_env=str(seen[0])), write(3, cost_usd=0.1, record_env=str(seen[1])),
            write(4, cost_usd=0.9, record_env=str(seen[2]))]  # one call costlier than any before
    cfg = with_proposer(root, repo, plan, {"max_cost_usd": 0.9},
                        budget={"iterations": 10, "cost_usd": 1.0, "wall_s": 600})
    o = await crucible.run(cfg)
    assert o.exit is LoopExit.BUDGET and verdicts(o) == ["keep", "keep"]  # 0.2 + a call of up to 0.9 > 1.0
    assert o.state.run.spent.cost_usd == pytest.approx(0.2) and not seen[2].exists()
    assert "cap $0.9000" in o.state.ended.reason
    told = [json.loads(p.read_text()) for p in seen[:2]]
    assert [t["CRUCIBLE_BUDGET_COST_USD"] for t in told] == ["1.000000", "0.900000"]
    assert [t["CRUCIBLE_BUDGET_ITERATIONS"] for t in told] == ["10", "9"]
    assert all(0 < float(t["CRUCIBLE_BUDGET_WALL_S"]) <= 600 for t in told)


async def test_waiting_for_an_unavailable_judge_at_the_baseline_is_parked_time(crucible: Crucible,
                                                                               root: Path) -> None:
    """The judge answers "come back later" (exit 75) twice for the baseline, 8 s apart: 16 s of waiting
    against a 12 s time budget; the active time (the baseline's judge runs, the iteration and its
    confirmation readings) stays under it even on a loaded 2-core machine (6 s was not, in CI)."""
    repo = await make_repo(root, "tempfail 2 1")
    cfg = make_config(root, repo, [write(2)], budget={"iterations": 1, "wall_s": 12.0}, gates={"retry_s": 8.0})
    o = await crucible.run(cfg)
    run = o.state.run
    assert o.exit is LoopExit.FINISHED, o.state.ended
    assert verdicts(o) == ["keep"]
    parked = o.of(SegmentOpened)[0].parked_ms
    assert parked >= 16000 and run.parked_total == timedelta(milliseconds=parked)  # exact: no float seconds
    assert run.spent.wall_ms >= 16000 > 12000 > run.active_ms


async def test_a_model_proposer_is_told_the_budget_left_in_its_prompt(crucible: Crucible, cfg: Config,
                                                                      root: Path) -> None:
    repo = await make_repo(root, "1")
    diff = "NOTE: raise\n```diff\n--- a/value.txt\n+++ b/value.txt\n@@ -1 +1 @@\n-1\n+2\n```\n"
    o = await crucible.run(make_config(root, repo, [], proposer={"model": {"adapter": "scripted",
                                                                           "outputs": [diff, "DONE"]}},
                                       budget={"iterations": 5, "cost_usd": 2.0}))
    prompts = [e.prompt for e in o.of(ProposalMade) if isinstance(e, ProposalMade)]
    assert len(prompts) == 2 and all(p is not None for p in prompts)
    async with backend(cfg, writer="test") as b:
        texts = [(await b.blobs.get(p)).decode() for p in prompts if p is not None]
    assert "Budget left: 5 iterations, 2.000000 USD." in texts[0] and "Budget left: 4 iterations" in texts[1]


async def test_a_blocked_proposers_retries_recheck_the_cost_budget(crucible: Crucible, root: Path) -> None:
    """A proposer that reports a missing resource (exit 75) is retried; each retry is a paid call, so the cost
    budget is checked again before each: it ends the session instead of retrying until ``max_block_s``."""
    repo = await make_repo(root, "1")
    plan = [{"cost_usd": 0.4, "exit": 75}]
    cfg = with_proposer(root, repo, plan, {}, budget={"iterations": 10, "cost_usd": 1.0, "wall_s": 600})
    o = await crucible.run(cfg)
    blocked = o.of(ProvisioningBlocked)
    assert o.exit is LoopExit.BUDGET and len(blocked) == 2, (o.exit, blocked)  # 0.4 + 0.4, then ≈ 0.4 more > 1.0
    assert o.state.run.spent.cost_usd == pytest.approx(0.8)
    assert verdicts(o) == ["abandoned"] and "cost budget" in o.state.ended.reason
    assert "the proposer was blocked" in o.state.ended.reason


async def test_an_unavailable_judges_retries_recheck_the_cost_budget(crucible: Crucible, root: Path) -> None:
    """A judge that is unavailable (exit 75) but billed for the call (a lab batch's runs that started) is measured
    again only while the cost budget allows another such call: the session ends on the budget, not after
    ``max_block_s`` of paid retries."""
    repo = await make_repo(root, "1")
    cfg = make_config(root, repo, [write("tempfail 100 5 0.4")], budget={"iterations": 3, "cost_usd": 1.0},
                      gates={"retry_s": 0.05, "max_block_s": 30})
    o = await crucible.run(cfg)
    blocked = [e for e in o.of(ProvisioningBlocked) if isinstance(e, ProvisioningBlocked) and e.resource == "judge"]
    assert o.exit is LoopExit.BUDGET and len(blocked) == 2, (o.exit, blocked)  # 0.4 + 0.4, then ≈ 0.4 more > 1.0
    assert o.state.run.spent.cost_usd == pytest.approx(0.8)
    assert verdicts(o) == ["abandoned"] and "a judge retry" in o.state.ended.reason
    assert "the judge was unavailable: gpu pool empty" in o.state.ended.reason
