"""Trajectory loader on every recorded file in the data folder, plus bad input (no server).

The workflows here are the **linear** form (``form="linear"``: one model step per turn, what the crucible
example's judge packs); the agent form ``reel replay`` runs is tested in test_trajectories_agent.py.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from reel.shared.core.agent.turncontext import model_items, turn_candidates
from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.pack.packer import pack
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER
from reel.shared.core.run.events import ContextPartition
from reel.shared.core.run.planning import TextFacts, policy_for
from reel.shared.core.trajectories import FORMATS, MAX_WORKFLOW_BYTES, detect_format, load_trajectories
from reel.shared.core.workflow.spec import ModelStep, ToolStep, WorkflowSpec, encode_workflow, parse_workflow

MINI_OK = "minisweagent_gemini3pro_django__django-11163.traj.json"
MINI_FAIL = "minisweagent_gemini3pro_django__django-10999.traj.json"
SWE = "sweagent_gpt4_pydicom__pydicom-1458.traj"
TAU = "taubench_gpt-4o-airline.json"
OH = "openhands_llama4maverick_multiswebench_ponyc_output.jsonl"
FILES = {MINI_OK: "mini-swe-agent", MINI_FAIL: "mini-swe-agent", SWE: "swe-agent", TAU: "tau-bench", OH: "openhands"}
COMPANIONS = (
    "minisweagent_gemini3pro_django__django-11163.report.json",
    "minisweagent_gemini3pro_django__django-10999.report.json",
    "sweagent_companion_swe-bench-dev-easy_first_only.json",
)
# Model turns per run, as SOURCES.md gives them (and the files confirm below).
MODEL_TURNS = {MINI_OK: [13], MINI_FAIL: [18], SWE: [12], OH: [23, 33, 49]}
TOOL_STEPS = {MINI_OK: [13], MINI_FAIL: [18], SWE: [12], OH: [22, 32, 49]}


def _raw(path: Path) -> Any:
    text = path.read_text()
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()] if path.suffix == ".jsonl" else json.loads(text)


def _model_steps(w: WorkflowSpec) -> list[ModelStep]:
    return [s for s in w.steps if isinstance(s, ModelStep)]


def _outputs(w: WorkflowSpec) -> dict[str, str]:
    return {s.id: (s.model.output if isinstance(s, ModelStep) else s.tool.output) or "" for s in w.steps}


def _partitions(w: WorkflowSpec) -> list[tuple[ModelStep, list[str], ContextPartition]]:
    """Each model step's candidate ids and partition, computed the executor's way (pure, no server)."""
    outs, result = _outputs(w), []
    for s in _model_steps(w):
        cands = turn_candidates(model_items(s, w, outs), TextFacts(DEFAULT_COUNTER))
        result.append((s, [c.id for c in cands], pack(cands, policy_for(s, w)).partition))
    return result


@pytest.fixture(scope="module")
def loaded(data_dir: Path) -> dict[str, list[WorkflowSpec]]:
    return {name: load_trajectories(data_dir / name, form="linear") for name in FILES}


# ---------------------------------------------------------------- detection
@pytest.mark.data
@pytest.mark.parametrize(("name", "fmt"), sorted(FILES.items()))
def test_detect_format_per_file(data_dir: Path, name: str, fmt: str) -> None:
    assert detect_format(_raw(data_dir / name)) == fmt


@pytest.mark.data
def test_every_file_in_data_dir_loads_or_is_rejected_clearly(data_dir: Path) -> None:
    for path in sorted(data_dir.iterdir()):
        if path.suffix == ".md":
            continue
        if path.name in COMPANIONS:
            with pytest.raises(TrajectoryFormatError) as exc:
                load_trajectories(path)
            assert str(path) in exc.value.message and "unknown trajectory format" in exc.value.message
        else:
            workflows = load_trajectories(path, form="linear") + load_trajectories(path)
            assert workflows and all(w.source["format"] in FORMATS for w in workflows), path.name


# ---------------------------------------------------------------- step counts
@pytest.mark.data
@pytest.mark.parametrize("name", sorted(MODEL_TURNS))
def test_step_counts_equal_recorded_turns(loaded: dict[str, list[WorkflowSpec]], name: str) -> None:
    workflows = loaded[name]
    assert [len(_model_steps(w)) for w in workflows] == MODEL_TURNS[name]
    assert [len(w.steps) - len(_model_steps(w)) for w in workflows] == TOOL_STEPS[name]


@pytest.mark.data
def test_step_counts_match_the_files_themselves(data_dir: Path, loaded: dict[str, list[WorkflowSpec]]) -> None:
    for name in (MINI_OK, MINI_FAIL):
        msgs = _raw(data_dir / name)["messages"]
        assert len(_model_steps(loaded[name][0])) == sum(m["role"] == "assistant" for m in msgs)
    swe = _raw(data_dir / SWE)
    assert len(_model_steps(loaded[SWE][0])) == len(swe["trajectory"]) == swe["info"]["model_stats"]["api_calls"]
    for w, rec in zip(loaded[OH], _raw(data_dir / OH), strict=True):
        calls = [e for e in rec["history"] if "action" in e and e.get("tool_call_metadata")]
        assert len(_model_steps(w)) == len(calls)
        assert w.name == rec["instance_id"]


@pytest.mark.data
def test_taubench_one_workflow_per_episode(data_dir: Path, loaded: dict[str, list[WorkflowSpec]]) -> None:
    episodes, workflows = _raw(data_dir / TAU), loaded[TAU]
    assert len(workflows) == len(episodes) == 200
    for w, ep in zip(workflows, episodes, strict=True):
        traj = ep["traj"]
        assert len(_model_steps(w)) == sum(m["role"] == "assistant" for m in traj)
        replies = sum(m["role"] == "user" and p["role"] == "assistant" and not p.get("tool_calls")
                      for p, m in itertools.pairwise(traj))
        assert len(w.steps) - len(_model_steps(w)) == sum(m["role"] == "tool" for m in traj) + replies
    assert sum(len(_model_steps(w)) for w in workflows) == 2454
    assert len({w.name for w in workflows}) == 200


@pytest.mark.data
def test_step_ids_pair_each_tool_step_with_its_turn(loaded: dict[str, list[WorkflowSpec]]) -> None:
    for workflows in loaded.values():
        for w in workflows:
            turn = ""
            for s in w.steps:
                prefix, _, kind = s.id.partition("-")
                if isinstance(s, ModelStep):
                    assert kind == "model" and prefix > turn
                    turn = prefix
                else:
                    assert prefix == turn and kind.startswith("tool") and s.tool.type == "recorded"


# ---------------------------------------------------------------- validity, references, size
@pytest.mark.data
def test_workflows_validate_round_trip_and_reference_only_earlier_steps(
    loaded: dict[str, list[WorkflowSpec]],
) -> None:
    for workflows in loaded.values():
        for w in workflows:
            assert parse_workflow(encode_workflow(w)) == w  # validate_workflow runs inside
            earlier: set[str] = set()
            for s in w.steps:
                if isinstance(s, ModelStep):
                    assert s.model.adapter == "replay" and s.model.output is not None
                    for item in s.context:
                        assert (item.from_step is None) != (item.text is None)
                        assert item.from_step is None or item.from_step in earlier
                earlier.add(s.id)


@pytest.mark.data
def test_step_outputs_are_referenced_never_copied(loaded: dict[str, list[WorkflowSpec]]) -> None:
    """Literal text only for what no step produced; each workflow stays far below the blob limit."""
    for workflows in loaded.values():
        for w in workflows:
            for s in _model_steps(w):
                for item in s.context:
                    if item.kind == "output":
                        assert item.from_step is not None and item.from_step.endswith("-model")
                    if item.from_step is None:
                        assert item.kind in ("system", "task", "demo", "message", "observation")
            assert len(encode_workflow(w)) < MAX_WORKFLOW_BYTES // 4, w.name


@pytest.mark.data
@pytest.mark.parametrize("name", [MINI_OK, MINI_FAIL, SWE])
def test_context_of_last_turn_is_the_recorded_conversation(
    data_dir: Path, loaded: dict[str, list[WorkflowSpec]], name: str
) -> None:
    raw = _raw(data_dir / name)
    msgs = raw["messages"] if name != SWE else raw["history"]
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    w = loaded[name][0]
    step = _model_steps(w)[-1]
    assert step.model.output == msgs[last]["content"]
    assert [i.text for i in model_items(step, w, _outputs(w))] == [m["content"] for m in msgs[:last]]
    assert [i.id for i in step.context] == [f"m{i:04d}" for i in range(last)]


@pytest.mark.data
def test_taubench_tool_calls_and_replies(data_dir: Path, loaded: dict[str, list[WorkflowSpec]]) -> None:
    traj, w = _raw(data_dir / TAU)[0]["traj"], loaded[TAU][0]
    call = next(m for m in traj if m.get("tool_calls"))
    step = next(s for s in _model_steps(w) if "<tool_call>" in (s.model.output or ""))
    assert json.loads(step.model.output.removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": call["tool_calls"][0]["function"]["name"],
        "arguments": json.loads(call["tool_calls"][0]["function"]["arguments"]),
    }
    tools = [s for s in w.steps if isinstance(s, ToolStep)]
    assert {t.tool.name for t in tools} >= {"get_user_details", "respond"}
    assert tools[0].tool.name == "respond" and tools[0].tool.output == traj[3]["content"]


# ---------------------------------------------------------------- usage and labels
@pytest.mark.data
def test_recorded_usage(data_dir: Path, loaded: dict[str, list[WorkflowSpec]]) -> None:
    msgs = [m for m in _raw(data_dir / MINI_OK)["messages"] if m["role"] == "assistant"]
    for s, m in zip(_model_steps(loaded[MINI_OK][0]), msgs, strict=True):
        usage = m["extra"]["response"]["usage"]
        assert s.model.usage is not None and s.model.name == "google/gemini-3-pro-preview"
        assert (s.model.usage.input_tokens, s.model.usage.output_tokens) == (
            usage["prompt_tokens"], usage["completion_tokens"])
        assert s.model.usage.cost_usd == pytest.approx(usage["cost"])
    assert all(s.model.usage is not None for w in loaded[OH] for s in _model_steps(w))
    assert all(s.model.usage is None for s in _model_steps(loaded[SWE][0]))


@pytest.mark.data
def test_outcome_labels(data_dir: Path, loaded: dict[str, list[WorkflowSpec]]) -> None:
    for name, expect in ((MINI_OK, True), (MINI_FAIL, False)):
        (w,) = loaded[name]
        labelled = [(v.type, v.name, v.expect) for v in w.verifiers if v.type == "recorded_outcome"]
        assert labelled == [("recorded_outcome", "recorded_outcome", expect)]
        assert w.source["outcome"] is expect and w.source["outcome_from"].endswith(".report.json")
        assert w.source["instance_id"] == w.name == name.split("_", 2)[2].removesuffix(".traj.json")
    (swe,) = loaded[SWE]
    assert [v for v in swe.verifiers if v.type == "recorded_outcome"] == []
    assert swe.source["exit_status"] == "submitted" and swe.source["outcome"] is None
    assert swe.name == "pydicom__pydicom-1458"
    rewards = [ep["reward"] for ep in _raw(data_dir / TAU)]
    assert [w.verifiers[0].expect for w in loaded[TAU]] == [r == 1.0 for r in rewards]
    assert sum(w.source["outcome"] for w in loaded[TAU]) == 84
    assert [[v.type for v in w.verifiers] for w in loaded[OH]] == [["context_requires"]] * 3
    assert [w.source["exit_status"] for w in loaded[OH]] == ["finished", "finished", "error"]
    assert "maximum iteration" in loaded[OH][2].source["error"]


# ---------------------------------------------------------------- packing
def _check_partition(ids: list[str], part: ContextPartition) -> None:
    buckets = [*part.packed, *part.available, *part.dropped]
    assert len(buckets) == len(set(buckets)) and set(buckets) == set(ids)
    assert list(part.packed) == [i for i in ids if i in set(part.packed)]  # prompt order = candidate order


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(FILES))
def test_small_budget_leaves_late_turns_short(data_dir: Path, name: str) -> None:
    for w in load_trajectories(data_dir / name, budget_tokens=1500, limit=20, form="linear"):
        parts = _partitions(w)
        for _, ids, part in parts:
            _check_partition(ids, part)
        late = parts[len(parts) * 2 // 3:]
        assert any(p.available or p.dropped for _, _, p in late), w.name
        if len(parts) >= 6:
            assert all(p.available or p.dropped for _, _, p in parts[-2:]), w.name


@pytest.mark.data
def test_default_budget_gives_real_partitions(loaded: dict[str, list[WorkflowSpec]]) -> None:
    swe = _partitions(loaded[SWE][0])
    assert all("m0001" in p.dropped for _, _, p in swe)  # the in-context demonstration: excluded kind
    assert all(dict(p.dropped_with_reasons())["m0001"] == "excluded_kind" for _, _, p in swe)  # recorded at pack time
    assert any(p.available for _, _, p in swe)
    mini = _partitions(loaded[MINI_FAIL][0])
    first = mini[0][2]
    assert first == ContextPartition(packed=("m0000", "m0001"), available=(), dropped=(),
                                     packed_tokens=first.packed_tokens, item_tokens=first.item_tokens)
    assert isinstance(first.packed_tokens, int) and first.packed_tokens > 0
    assert mini[-1][2].dropped and mini[-1][2].available
    oh = _partitions(loaded[OH][2])
    assert len(oh[-1][2].available) > len(oh[-1][2].packed) // 2
    for _, ids, part in swe + mini + oh:
        _check_partition(ids, part)


@pytest.mark.data
def test_limit(data_dir: Path) -> None:
    first = [f"taubench_gpt-4o-airline-task{ep['task_id']}-trial{ep['trial']}" for ep in _raw(data_dir / TAU)[:2]]
    assert [w.name for w in load_trajectories(data_dir / TAU, limit=2, form="linear")] == first
    assert load_trajectories(data_dir / OH, limit=0, form="linear") == []
    assert [w.budget_tokens for w in load_trajectories(data_dir / SWE, budget_tokens=1234, form="linear")] == [1234]


# ---------------------------------------------------------------- bad input (no data needed)
def _write(tmp_path: Path, name: str, content: bytes | str | Any) -> Path:
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content if isinstance(content, str) else json.dumps(content))
    return p


@pytest.mark.parametrize(
    ("name", "content", "needles"),
    [
        ("garbage.traj", b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage", ["not JSON or JSON Lines", "mini-swe-agent"]),
        ("empty.json", b"  \n", ["empty file"]),
        ("shape.json", {"foo": 1, "bar": [1, 2]}, ["unknown trajectory format", "keys foo, bar", "SWE-agent"]),
        ("list.json", [1, 2, 3], ["unknown trajectory format", "list of 3 items", "tau-bench"]),
        ("scalar.json", "42", ["unknown trajectory format", "a JSON int"]),
        ("bad.jsonl", '{"instance_id": "x", "history": []}\n{not json\n', ["not JSON or JSON Lines"]),
        ("mini.traj.json", {"trajectory_format": "mini-swe-agent-1", "messages": 5},
         ["does not match its schema", "$.messages"]),
        ("swe.traj", {"trajectory": [], "history": [{"role": "user"}]}, ["SWE-agent", "content", "$.history[0]"]),
        ("tau.json", [{"traj": [{"role": "assistant", "content": 7}]}], ["episode 0", "$.traj[0].content"]),
        ("noturn.traj.json",
         {"trajectory_format": "mini-swe-agent-1", "messages": [{"role": "system", "content": "s"}]},
         ["no recorded model turns"]),
    ],
)
def test_bad_files_raise_a_helpful_error(tmp_path: Path, name: str, content: Any, needles: list[str]) -> None:
    path = _write(tmp_path, name, content)
    with pytest.raises(TrajectoryFormatError) as exc:
        load_trajectories(path)
    assert str(path) in exc.value.message and exc.value.code == "trajectory_format"
    for needle in needles:
        assert needle in exc.value.message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    for path in (tmp_path / "nope.traj", tmp_path):
        with pytest.raises(TrajectoryFormatError, match="cannot read trajectory"):
            load_trajectories(path)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="budget_tokens"):
        load_trajectories(tmp_path / "x", budget_tokens=0)
    with pytest.raises(ValueError, match="limit"):
        load_trajectories(tmp_path / "x", limit=-1)


def test_detect_format_error_names_the_expected_formats() -> None:
    with pytest.raises(TrajectoryFormatError) as exc:
        detect_format({"messages": []})
    assert "keys messages" in exc.value.message and "trajectory_format" in exc.value.message


# ---------------------------------------------------------------- a small synthetic recording (no data needed)
def _mini(n_turns: int, observation: str = "same") -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a shell agent."},
                                  {"role": "user", "content": "<pr_description>fix it</pr_description>"}]
    for i in range(n_turns):
        usage = {"prompt_tokens": 100 + i, "completion_tokens": 10, "cost": 0.001}
        msgs.append({"role": "assistant", "content": f"THOUGHT: step {i}\n\n```bash\necho {i}\n```",
                     "extra": {"response": {"model": "m", "usage": usage}}})
        out = observation if observation == "same" else f"{i}: {observation}"
        msgs.append({"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{out}\n</output>"})
    return {"trajectory_format": "mini-swe-agent-1", "instance_id": "o__r-1", "messages": msgs,
            "info": {"exit_status": "Submitted", "mini_version": "1.15.0"}}


@pytest.mark.parametrize(("report", "expect"), [({"resolved": True}, True), ({"o__r-1": {"resolved": False}}, False),
                                                ({"other__r-2": {"resolved": True}}, None), (None, None)])
def test_synthetic_mini_swe_agent(tmp_path: Path, report: Any, expect: bool | None) -> None:
    path = _write(tmp_path, "run.traj.json", _mini(5))
    if report is not None:
        _write(tmp_path, "run.report.json", report)
    (w,) = load_trajectories(path, budget_tokens=60, form="linear")
    assert [s.id for s in w.steps][:3] == ["t01-model", "t01-tool", "t02-model"]
    tool = w.step("t03-tool")
    assert isinstance(tool, ToolStep) and (tool.tool.name, tool.tool.input) == ("bash", "echo 2")
    assert [v.expect for v in w.verifiers if v.type == "recorded_outcome"] == ([] if expect is None else [expect])
    assert w.source["outcome"] is expect and w.source["agent"] == "mini-swe-agent 1.15.0"
    last = _partitions(w)[-1][2]
    assert {"m0005", "m0007", "m0009"} <= set(last.dropped)  # repeated observations: duplicates
    assert last.available  # 60 tokens cannot hold the rest


def test_unreadable_companion_report_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "run.traj.json", _mini(1))
    _write(tmp_path, "run.report.json", b"{oops")
    with pytest.raises(TrajectoryFormatError, match=r"run\.report\.json: unreadable SWE-bench report"):
        load_trajectories(path)


def test_many_turns_widen_step_ids_and_stay_small(tmp_path: Path) -> None:
    """120 turns with 5 kB observations: copying each turn's history would take ~36 MB; references ~2 MB."""
    (w,) = load_trajectories(_write(tmp_path, "long.traj.json", _mini(120, "x" * 5000)), form="linear")
    assert w.steps[0].id == "t001-model" and w.steps[-1].id == "t120-tool"
    assert len(encode_workflow(w)) < 3 * 1024 * 1024


def test_every_replay_gets_a_task_in_context_verifier(data_dir: Path) -> None:
    """Every replayed trajectory ends with at least one verdict: the task must be packed in the last model step."""
    for f in sorted(data_dir.iterdir()):
        if "report" in f.name or "companion" in f.name or f.suffix == ".md":
            continue
        for w in load_trajectories(f, limit=3, form="linear"):
            checks = [v for v in w.verifiers if v.type == "context_requires"]
            assert len(checks) == 1, f.name
            last_model = [s for s in w.steps if isinstance(s, ModelStep)][-1]
            assert checks[0].step == last_model.id
            task_ids = [c.id for c in w.steps[0].context if c.kind == "task"]  # type: ignore[union-attr]
            assert checks[0].item == task_ids[0]
