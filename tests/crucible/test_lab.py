"""Crucible's ``lab:`` judge: a candidate world scored by the pass rate of live runs (docs/crucible.md).

The worked example (examples/crucible-agent) end to end, smaller: the real executor and verifier in-process on
the test's nats-server and namespace, the loopback chat-completions server answering as the example's model
(model.py: it fixes the typo only as often as its instructions tell it how), the example's proposer and world.
Then configs a lab judge cannot work with, refused with the reason.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from reel.services.crucible.gates import protected_paths
from reel.services.crucible.report import lab_pass_rate, rows_table
from reel.services.crucible.world import git
from reel.shared.crucible.config import SessionConfig, parse_config
from reel.shared.crucible.errors import ConfigInvalid
from reel.shared.crucible.events import MeasureFinished, SegmentOpened
from reel.shared.crucible.state import Fate, LoopExit, Reading
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.crucible.conftest import Crucible
from tests.support.chat_server import ChatServer

REPO = Path(__file__).resolve().parents[2]
DEMO_KEY = "crucible-agent-demo-key"
"""The example's model key: the loopback server takes any; a value no request text holds (a key is redacted
from what the executor records, in this process for good)."""
EXAMPLE = REPO / "examples" / "crucible-agent"
RUNS = 4  # live runs per reading: small, the model's chances (0.25 → 0.75) still far apart


def _model() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crucible_agent_model", EXAMPLE / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _world(into: Path) -> Path:
    shutil.copytree(EXAMPLE / "world", into)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@localhost", "PATH": "/usr/bin:/bin"}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "world"]):
        subprocess.run(["git", *argv], cwd=into, env=env, check=True)
    return into


def _config(root: Path, world: Path, url: str, **override: Any) -> SessionConfig:
    data = yaml.safe_load((EXAMPLE / "crucible.yaml").read_text())
    data["world"]["workdir"] = str(root / "sessions")
    for key, value in override.items():
        data[key] = value
    return parse_config(data, config_dir=str(EXAMPLE), cwd=str(root),
                        environ={"CRUCIBLE_AGENT_WORLD": str(world), "AGENT_MODEL_URL": url},
                        config_path=str(EXAMPLE / "crucible.yaml"))


@pytest.fixture
async def model_server() -> AsyncIterator[ChatServer]:
    server: ChatServer = await _model().serve()
    try:
        yield server
    finally:
        await server.stop()


async def test_the_worked_example_keeps_an_instruction_change_and_discards_a_rewording(
        executor: None, verifier: None, crucible: Crucible, client: ReelClient, model_server: ChatServer,
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_MODEL_KEY", DEMO_KEY)
    world = _world(root / "world-src")
    data = yaml.safe_load((EXAMPLE / "crucible.yaml").read_text())
    judge = {**data["judge"], "lab": {**data["judge"]["lab"], "runs": RUNS}}
    cfg = _config(root, world, model_server.url, judge=judge, budget={"iterations": 2},
                  noise={"confirm_repeats": 2})
    t0 = time.perf_counter()
    o = await crucible.run(cfg, session_id="lab-example")
    wall_s = time.perf_counter() - t0

    assert o.exit is LoopExit.FINISHED, (o.exit, o.state.ended)
    run = o.state.run
    assert run is not None
    rows = {r.it: r for r in run.rows}
    assert [rows[1].verdict, rows[2].verdict] == [Fate.DISCARD, Fate.KEEP], rows_table(o.state)
    assert rows[1].note.startswith("reword") and rows[2].note == "add: read the file first"
    assert run.segment.best_snap == rows[2].kept_sha and run.segment.best_score > run.segment.baseline_score
    kept = await git(Path(o.state.started.world_dir), "show", f"{rows[2].kept_sha}:instructions.md")
    assert "Read the file before you change it." in kept

    # every value is a pass rate of RUNS live runs; the fingerprint holds the workflow, not the instructions
    opened = o.of(SegmentOpened)[0]
    assert isinstance(opened, SegmentOpened)
    assert "workflow:agent.yaml" in opened.fingerprint_parts
    assert not any("instructions" in part for part in opened.fingerprint_parts)
    readings = [e.reading for e in o.of(MeasureFinished) if isinstance(e, MeasureFinished)]
    assert all(isinstance(r, Reading) and r.total == RUNS for r in readings)
    assert all(v * RUNS == round(v * RUNS) for r in readings if isinstance(r, Reading) for v in r.values)
    assert rows[2].cost_usd > 0  # the runs' priced model calls are the judge's cost

    # the runs behind the readings are real runs of the namespace, labelled with the iteration that made them
    measured = len(readings) + 1  # the baseline's reading is in its segment_opened
    ids = await client.log.list_runs()
    states = [await client.log.load(i) for i in ids]
    ours = [s for s in states if s.labels.get("crucible.session") == "lab-example"]
    assert len(ours) == measured * RUNS, (len(ours), measured)
    assert {s.labels["crucible.target"] for s in ours} == {"baseline", "candidate", "incumbent"}
    kept_runs = [s for s in ours
                 if s.labels["crucible.iteration"] == "2" and s.labels["crucible.target"] == "candidate"]
    assert kept_runs and {s.labels["crucible.sha"] for s in kept_runs} == {rows[2].kept_sha}
    assert all(str(s.status) == "completed" for s in ours)
    rate = lab_pass_rate(o.state.started.config, "main", rows[2].readings)
    assert rate is not None and rate.runs == RUNS * len(rows[2].readings)
    assert "agent.yaml" in protected_paths(cfg, world)  # the judge's workflow: no candidate may touch it
    assert wall_s < 90, wall_s


def _lab(**lab: Any) -> dict[str, Any]:
    return {"workflow": "agent.yaml", "runs": 4, "verifier": "tests-pass",
            "files": {"AGENT_INSTRUCTIONS": "instructions.md"}, **lab}


@pytest.mark.parametrize(("judge", "reason"), [
    ({"lab": _lab(runs=0)}, "judge.lab.runs must be ≥ 1"),
    ({"lab": _lab(concurrency=0)}, "judge.lab.concurrency must be ≥ 1"),
    ({"lab": _lab(), "direction": "minimize"}, "its direction must be maximize"),
    ({"lab": _lab(), "command": ["true"]}, "a `command` or a `lab`, not both"),
    ({"lab": _lab(workflow="/etc/agent.yaml")}, "must be a path inside the world"),
    ({"lab": _lab(files={"X": "../outside.md"})}, "judge.lab.files.X must be a path inside the world"),
    ({"lab": _lab(workflow="agent.txt")}, "must be a .yaml, .yml or .json workflow file"),
    ({"lab": _lab(verifier=" ")}, "must name one of the workflow's verifiers"),
    ({"lab": _lab(runs="eight")}, "Expected `int`"),
    ({"lab": {"workflow": "agent.yaml", "runs": 4}}, "missing required field `verifier`"),
    ({"lab": _lab(samples=3)}, "unknown field `samples`"),
    ({"direction": "maximize"}, "the judge needs a `command` or a `lab`"),
])
def test_a_bad_lab_judge_is_refused_at_load(judge: dict[str, Any], reason: str, root: Path) -> None:
    with pytest.raises(ConfigInvalid) as got:
        _config(root, root, "http://127.0.0.1:9/v1", judge=judge)
    assert reason in got.value.message, got.value.message


@pytest.mark.parametrize(("lab", "reason"), [
    (_lab(verifier="tests-green"), "judge.lab.verifier 'tests-green' is not a verifier of agent.yaml "
                                   "(it has: tests-pass)"),
    (_lab(workflow="missing.yaml"), "judge.lab.workflow 'missing.yaml' is not a file of the world"),
    (_lab(files={}), "the workflow does not load: agent.yaml: environment variable AGENT_INSTRUCTIONS is not set"),
])
async def test_a_lab_that_cannot_measure_the_world_is_refused_before_the_session(
        lab: dict[str, Any], reason: str, crucible: Crucible, root: Path) -> None:
    world = _world(root / "world-src")
    env = {"AGENT_MODEL_URL": "http://127.0.0.1:9/v1", "AGENT_EXAMPLE": str(EXAMPLE.parent / "agent")}
    cfg = _config(root, world, "http://127.0.0.1:9/v1", judge={"lab": {**lab, "env": env}})
    with pytest.raises(ConfigInvalid) as got:
        await crucible.run(cfg, session_id="lab-refused")
    assert reason in got.value.message, got.value.message


async def test_a_batch_that_does_not_finish_is_an_invalid_reading_and_its_runs_are_cancelled(
        executor: None, crucible: Crucible, client: ReelClient, infra: Infra, cfg: Config, model_server: ChatServer,
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No verifier serves the namespace: the runs stay ``verifying``, the batch times out, the baseline is
    invalid (the session escalates) and the runs it started are cancelled, not left running."""
    from reel.services.cancel.app import serve as cancel_serve

    monkeypatch.setenv("AGENT_MODEL_KEY", DEMO_KEY)
    data = yaml.safe_load((EXAMPLE / "crucible.yaml").read_text())
    judge = {**data["judge"], "lab": {**data["judge"]["lab"], "runs": 2}, "timeout_s": 10}
    async with running(cancel_serve, infra, cfg):
        o = await crucible.run(_config(root, _world(root / "world-src"), model_server.url, judge=judge),
                               session_id="lab-timeout")
    assert o.exit is LoopExit.ESCALATED and o.state.ended is not None
    assert "baseline of regime main is invalid: timeout after 10s: 0 of 2 lab runs finished" in o.state.ended.reason
    ours = [s for s in [await client.log.load(i) for i in await client.log.list_runs()]
            if s.labels.get("crucible.session") == "lab-timeout"]
    assert len(ours) == 2 and all(str(s.status) == "cancelled" for s in ours), [str(s.status) for s in ours]


async def test_a_start_no_executor_answers_makes_the_lab_judge_unavailable(
        crucible: Crucible, model_server: ChatServer, root: Path) -> None:
    """Nothing serves the namespace: the start is not answered, the judge is unavailable (waited out, as exit
    75 is for a command), and past ``max_block_s`` the session escalates with that reason."""
    data = yaml.safe_load((EXAMPLE / "crucible.yaml").read_text())
    judge = {**data["judge"], "lab": {**data["judge"]["lab"], "runs": 1}, "timeout_s": 2}
    cfg = _config(root, _world(root / "world-src"), model_server.url, judge=judge,
                  gates={"retry_s": 0.1, "max_block_s": 0.5, "protect": ["propose.py"]})
    o = await crucible.run(cfg, session_id="lab-unavailable")
    assert o.exit is LoopExit.ESCALATED and o.state.ended is not None
    assert "judge unavailable for the baseline longer than 0.5s: no executor answered a lab run's start" \
        in o.state.ended.reason, o.state.ended.reason
