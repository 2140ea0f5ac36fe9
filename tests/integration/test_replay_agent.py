"""``reel replay`` through the agent loop, as a user runs it: recorded tau-bench and mini-swe-agent runs become
agent steps the real executor drives (replay adapter + recorded tools); ``reel show --json`` lists each turn with
its partition and each tool call with its tool name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reel.shared.core.trajectories import load_trajectories
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.runtime.config import Config
from tests.integration.test_cli import reel
from tests.refold import assert_refold_identical

pytestmark = pytest.mark.data

TAU = "taubench_gpt-4o-airline.json"
MINI = "minisweagent_gemini3pro_django__django-11163.traj.json"


async def test_replayed_runs_are_agent_runs(cfg: Config, event_log: JetStreamEventLog, data_dir: Path) -> None:
    code, out, err = await reel(cfg, "replay", str(data_dir / TAU), str(data_dir / MINI), "--limit", "2",
                                "--no-timelines", timeout_s=240)
    assert code == 3, (out, err)  # the second tau-bench episode's recorded outcome is a failure
    runs = re.findall(r"(\S+): run (r-[0-9a-f]{20})", out)
    assert [name for name, _ in runs] == [w.name for w in load_trajectories(data_dir / TAU, limit=2)] + [
        "django__django-11163"]
    specs = {w.name: w for f in (TAU, MINI) for w in load_trajectories(data_dir / f, limit=2)}
    for name, run_id in runs:
        spec = specs[name]
        state = await event_log.load(run_id)
        assert state.status == "completed"
        assert state.outcome == ("passed" if spec.source["outcome"] else "failed")
        assert sorted((v.verifier, v.status) for v in state.verdicts) == sorted(
            [("task-in-final-context", "pass"), ("recorded_outcome", "pass" if spec.source["outcome"] else "fail")])
        await assert_refold_identical(event_log, state)

        code, shown, err = await reel(cfg, "show", run_id, "--json")
        assert code == 0, err
        steps = json.loads(shown)["steps"]
        agent = spec.steps[0]
        turns = agent.model.scripted_turns  # type: ignore[union-attr]
        assert [s["step_id"] for s in steps if s["kind"] == "model"] == [f"replay:t{t}" for t in
                                                                         range(1, len(turns) + 1)]
        for s in steps:
            if s["kind"] == "model":
                part = s["attempts"][-1]["context"]
                assert {"packed", "available", "dropped", "packed_tokens", "reserved_tokens", "tokenizer",
                        "item_tokens", "budget_tokens"} <= set(part) <= {
                    "packed", "available", "dropped", "drop_reasons", "packed_tokens", "reserved_tokens", "tokenizer",
                    "item_tokens", "budget_tokens", "trimmed"}
                # an item cut before packing is still a candidate: in one of the three buckets
                assert set(part.get("trimmed", [])) <= {*part["packed"], *part["available"], *part["dropped"]}
                assert len(part["item_tokens"]) == len(part["packed"]) + len(part["available"]) + len(part["dropped"])
                assert part["tokenizer"] == "heuristic-v1"
                assert "instructions" in part["packed"] and part["packed_tokens"] > 0
                assert len(part.get("drop_reasons", [])) == len(part["dropped"])  # a reason beside each drop
        calls = [(s["tool_name"], s["call_id"], s["status"], s["is_error"]) for s in steps if s["kind"] == "tool"]
        assert calls == [(c.name, c.id, "succeeded", False) for t in turns for c in t.tool_calls]

    tau_run = runs[0][1]
    code, shown, err = await reel(cfg, "show", tau_run)
    assert code == 0, err
    assert "tool get_user_details" in shown and "tool respond" in shown and "agent replay: succeeded" in shown
