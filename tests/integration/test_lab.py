"""``reel lab`` as a user runs it (the ``reel`` command in a real process with its services, the real server):
three recordings replayed, each forked with its task dropped from the turn the context check judged; the flips
are the runs that passed, every fork is a branch in the log; a refused edit skips its run; a bad SPEC starts
nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reel.services.cancel.app import serve as serve_cancel
from reel.shared.core.run.compare import compare
from reel.shared.core.run.events import BranchForked
from reel.shared.core.run.forkedits import Drop, describe
from reel.shared.core.run.ids import BranchId
from reel.shared.core.run.persistent import FrozenMap
from reel.shared.core.trajectories import load_trajectories
from reel.shared.core.workflow.spec import AgentStep
from reel.shared.nats.client import ReelClient
from reel.shared.nats.eventlog import JetStreamEventLog
from reel.shared.nats.infra import Infra
from reel.shared.runtime.config import Config
from tests.conftest import running
from tests.integration.test_cli import reel

pytestmark = pytest.mark.data

FILES = ("minisweagent_gemini3pro_django__django-11163.traj.json", "minisweagent_gemini3pro_django__django-11163"
         ".report.json", "minisweagent_gemini3pro_django__django-10999.traj.json",
         "minisweagent_gemini3pro_django__django-10999.report.json", "sweagent_gpt4_pydicom__pydicom-1458.traj")
SWE = "sweagent_gpt4_pydicom__pydicom-1458.traj"


def _folder(tmp_path: Path, data_dir: Path) -> Path:
    """Three recordings (two with their SWE-bench reports, one unlabelled) and a file that is none, linked."""
    folder = tmp_path / "recordings"
    folder.mkdir()
    for name in FILES:
        (folder / name).symlink_to(data_dir / name)
    (folder / "README.md").write_text("not a recording\n")
    return folder


def _spec(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(body)
    return path


async def test_lab_over_replayed_recordings(cfg: Config, event_log: JetStreamEventLog, tmp_path: Path,
                                            data_dir: Path) -> None:
    folder = _folder(tmp_path, data_dir)
    bad = _spec(tmp_path, "bad", "runs: {recordings: recordings}\nat: {turn: 1}\n")
    code, out, err = await reel(cfg, "lab", str(bad))
    assert code == 1 and err.strip().splitlines()[-1].startswith(f"error: lab_spec: {bad}: "), (out, err)
    assert "`edit`" in err and await event_log.list_runs() == []  # nothing started

    spec = _spec(tmp_path, "drop_task", "runs: {recordings: recordings}\n"
                 "at: {judged_by: task-in-final-context}\nedit: {drop: {kind: task}}\n")
    code, out, err = await reel(cfg, "lab", str(spec), "--json", "--concurrency", "3", timeout_s=90)
    assert code == 0, (out, err)
    report = json.loads(out)
    names = {r["run_id"]: r["source"] for r in report["results"]}
    by_source = {s: r for r, s in names.items()}
    assert sorted(names.values()) == sorted(f for f in FILES if not f.endswith(".report.json"))
    assert "not a recording, left out" in err and "README.md" in err
    # before: every verifier of each run (recorded_outcome where labelled, and the context check); 10999's
    # recorded outcome is a failure, so it fails on both sides and does not flip
    assert (report["runs"], report["counted"], report["skipped"]) == (3, 3, [])
    assert (report["before"]["passes"], report["after"]["passes"]) == (2, 0)
    assert report["before"]["low"] < 2 / 3 < report["before"]["high"]
    flipped = {f["run_id"]: f for f in report["pass_to_fail"]}
    assert set(flipped) == {by_source[FILES[0]], by_source[SWE]} and report["fail_to_pass"] == []
    for line in (f"forked {r} at " for r in names):
        assert line in err, err  # a progress line per run
    specs = {w.name: w for f in FILES if not f.endswith(".report.json") for w in load_trajectories(folder / f)}
    tasks: dict[str, str] = {}
    for result in report["results"]:
        state = await event_log.load(result["run_id"])
        forks = [e for _, c in await event_log.read(result["run_id"]) for e in c.events if isinstance(e, BranchForked)]
        agent = specs[state.workflow_name].steps[0]
        assert isinstance(agent, AgentStep)
        task = tasks[result["run_id"]] = next(i.id for i in agent.context if i.kind == "task")
        assert [(f.branch_id, f.parent_branch_id, f.from_step, f.edits, f.by) for f in forks] == [
            (result["branch_id"], "main", result["at_step"], (Drop(item=task),), "reel lab")]
        judged = [v for v in state.verdicts if v.verifier == "task-in-final-context"]
        assert {(v.branch_id, v.step_id, v.status) for v in judged} == {
            ("main", result["at_step"], "pass"), (result["branch_id"], result["at_step"], "fail")}
        assert state.labels["lab"] == "drop_task"

    # the same SPEC again: the same forks (the lab's keys), as a table whose run and branch ids are whole
    code, out, err = await reel(cfg, "lab", str(spec))
    assert code == 0, (out, err)
    assert "flipped pass → fail: 2" in out and "flipped fail → pass: 0" in out and "2/3 = 66.7 %" in out, out
    for f in flipped.values():
        assert re.search(rf"{f['run_id']}\s+│\s+{f['branch_id']}\s+│\s+{f['at_step']}", out), out
    for run_id, f in flipped.items():  # a fork is a branch like any other: reel compare's facts of it
        found = compare(await event_log.load(run_id), [BranchId("main"), BranchId(f["branch_id"])], {})
        assert [describe(e) for e in found.branches[1].edits] == [f"drop {tasks[run_id]}"]
        assert found.branches[1].verdicts["task-in-final-context"] == "fail"
        assert found.partitions[0].dropped_by_fork == (tasks[run_id],)

    # runs by label; an edit the rewind service refuses (the task is packed already) skips the run, says why
    refused = _spec(tmp_path, "restore", f"runs: {{label: replayed_from={SWE}}}\nat: {{turn: 1}}\n"
                    "edit: {restore: {kind: task}}\nverifier: task-in-final-context\n")
    code, out, err = await reel(cfg, "lab", str(refused), "--json")
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["runs"] == 1 and report["counted"] == 0 and report["skipped"][0]["run_id"] == by_source[SWE]
    assert report["skipped"][0]["reason"].startswith("fork refused: invalid_edit: item ")
    assert "packed in turn replay:t1 already" in report["skipped"][0]["reason"]


@pytest.mark.usefixtures("executor", "verifier")
async def test_lab_over_a_live_agent_run_forks_after_its_first_failing_tool_call(
        cfg: Config, event_log: JetStreamEventLog, tmp_path: Path) -> None:
    code, out, err = await reel(cfg, "run", "examples/agent/fix_typo.yaml", "-q")
    assert code == 0, (out, err)
    run_id = re.search(r"run (r-[0-9a-f]{20})", out).group(1)  # type: ignore[union-attr]
    main = await event_log.load(run_id)
    assert main.branches["main"].attempts["fix:t1:c1"][-1].status == "failed"  # run_tests fails before the fix
    spec = _spec(tmp_path, "passing_tests", f"runs: {{ids: [{run_id}]}}\nat: {{after_first_failing_tool: true}}\n"
                 "edit: {tool_result: {call: 'fix:t1:c1', text: 'Ran 2 tests. OK'}}\n")
    code, out, err = await reel(cfg, "lab", str(spec), "--json")
    assert code == 0, (out, err)
    report = json.loads(out)
    (result,) = report["results"]
    assert (result["at_step"], result["before"], result["after"]) == ("fix:t2", "pass", "pass")  # the turn after
    assert report["verifiers"] == [] and report["pass_to_fail"] == report["fail_to_pass"] == []
    state = await event_log.load(run_id)
    fork = state.branches[result["branch_id"]]
    assert (fork.parent_branch_id, fork.from_step, fork.forked_by) == ("main", "fix:t2", "reel lab")
    assert [v.status for v in state.verdicts if v.branch_id == result["branch_id"]] == ["pass"]  # its own files


@pytest.mark.usefixtures("executor", "verifier")
async def test_a_fork_that_waits_for_a_person_is_skipped_not_waited_for(
        cfg: Config, infra: Infra, client: ReelClient, event_log: JetStreamEventLog, tmp_path: Path) -> None:
    code, out, err = await reel(cfg, "run", "examples/agent/approval.yaml", "-q")
    assert code == 6, (out, err)  # awaiting input
    run_id = re.search(r"run (r-[0-9a-f]{20})", out).group(1)  # type: ignore[union-attr]
    state = await event_log.load(run_id)
    requests = state.branches["main"].requests
    assert isinstance(requests, FrozenMap)
    async with running(serve_cancel, infra, cfg):  # the service that takes answers
        for step, req in requests.items():
            reply = await (client.respond(run_id, req.request_id, "approve") if step == "ship:t1:c0" else
                           client.respond(run_id, req.request_id, "answer", text="v1"))
            assert reply.ok, reply
    assert (await client.wait_for(run_id, ("completed",), timeout_s=60)).outcome == "passed"
    spec = _spec(tmp_path, "cooler", f"runs: {{ids: [{run_id}, r-00000000000000000000]}}\nat: {{turn: 1}}\n"
                 "edit: {param: {temperature: 0}}\n")
    code, out, err = await reel(cfg, "lab", str(spec), "--json", "--timeout", "50")
    assert code == 0, (out, err)
    skipped = {s["run_id"]: s["reason"] for s in json.loads(out)["skipped"]}
    assert skipped == {run_id: "the fork waits for input (reel pending); it is not judged",
                       "r-00000000000000000000": "no such run"}
