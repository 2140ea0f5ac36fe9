"""``kind: agent`` workflow steps: parsed from JSON and YAML alike, refused at load
with the field named, and the import check of ``python:`` tools outside the core."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from reel.shared.application.toolimports import check_tool_imports
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.run.events import StepDecl
from reel.shared.core.workflow.spec import AgentStep, parse_workflow


def _agent(**kw: Any) -> dict[str, Any]:
    return {"kind": "agent", "id": "solve", "max_turns": 6, "max_attempts": 3, "max_parallel_tools": 2,
            "instructions": "Fix the bug.", "model": {"adapter": "scripted", "turns": [
                {"text": "", "tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]}, {"text": "done"}]},
            "context": [{"id": "task", "kind": "task", "text": "tests fail"}], "policy": {"budget_tokens": 4000},
            "tools": [
                {"name": "read_file", "description": "read one file",
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
                 "python": "json:loads"},
                {"name": "run_tests", "command": ["python3", "-m", "unittest"], "retry_safe": True, "fatal": True},
                {"name": "lookup", "recorded": {"by_call_id": {"call_1": "42"}}},
            ], **kw}


VALID = {"name": "wf", "steps": [{"kind": "tool", "id": "prep", "tool": {"type": "recorded", "output": "ok"}},
                                 _agent(),
                                 {"kind": "model", "id": "review", "model": {"adapter": "scripted", "outputs": ["x"]},
                                  "context": [{"id": "answer", "from_step": "solve"}]}],
         "verifiers": [{"type": "output_regex", "step": "solve:t1", "pattern": "x"}]}


def test_an_agent_step_parses_from_json_yaml_and_a_mapping() -> None:
    spec = parse_workflow(json.dumps(VALID))
    assert parse_workflow(yaml.safe_dump(VALID)) == spec == parse_workflow(VALID)
    agent = spec.agent("solve")
    assert isinstance(agent, AgentStep) and [t.type for t in agent.tools] == ["python", "command", "recorded"]
    assert (agent.tools[0].retry_safe, agent.tools[1].retry_safe, agent.tools[1].fatal) == (False, True, True)
    assert spec.decls()[1] == StepDecl(step_id="solve", kind="agent", max_attempts=3, max_turns=6,
                                       max_parallel_tools=2)
    with pytest.raises(KeyError):
        spec.step("solve")  # a Dispatch never names an agent step
    defaults = parse_workflow({"name": "w", "steps": [_agent(tools=[])]}).agent("solve")
    assert defaults.tools == ()


def _with(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    wf = copy.deepcopy(VALID)
    change(wf["steps"][1])
    return wf


BAD: dict[str, tuple[dict[str, Any], str, str]] = {
    # name: (workflow, the field path the message names, a word it contains)
    "unknown-tool-type": (_with(lambda a: a["tools"].append({"name": "web", "http": "https://x"})),
                          "$.steps[1].tools[3]", "http"),
    "no-tool-type": (_with(lambda a: a["tools"].append({"name": "nothing"})), "$.steps[1].tools[3]", "got none"),
    "two-tool-types": (_with(lambda a: a["tools"][0].update(command=["ls"])), "$.steps[1].tools[0]", "python, command"),
    "duplicate-tool": (_with(lambda a: a["tools"].append({"name": "read_file", "python": "a:b"})),
                       "$.steps[1].tools[3].name", "duplicate"),
    "bad-tool-name": (_with(lambda a: a["tools"][0].update(name="read file")), "$.steps[1].tools[0].name", "read file"),
    "params-not-a-schema": (_with(lambda a: a["tools"][0].update(parameters={"type": "objekt"})),
                            "$.steps[1].tools[0].parameters", "JSON Schema"),
    "params-not-an-object": (_with(lambda a: a["tools"][0].update(parameters={"type": "string"})),
                             "$.steps[1].tools[0].parameters.type", "object"),
    "python-path": (_with(lambda a: a["tools"][0].update(python="no_colon")), "$.steps[1].tools[0].python",
                    "module:function"),
    "empty-command": (_with(lambda a: a["tools"][1].update(command=[])), "$.steps[1].tools[1].command", "argv"),
    "empty-recorded": (_with(lambda a: a["tools"][2].update(recorded={})), "$.steps[1].tools[2].recorded", "output"),
    "tool-attempts": (_with(lambda a: a["tools"][1].update(max_attempts=0)), "$.steps[1].tools[1].max_attempts",
                      ">= 1"),
    "tool-timeout": (_with(lambda a: a["tools"][1].update(timeout_s=0)), "$.steps[1].tools[1].timeout_s", "> 0"),
    "max-turns": (_with(lambda a: a.update(max_turns=0)), "$.steps[1].max_turns", ">= 1"),
    "max-parallel": (_with(lambda a: a.update(max_parallel_tools=0)), "$.steps[1].max_parallel_tools", ">= 1"),
    "no-task": (_with(lambda a: a.update(context=[{"id": "x", "text": "y"}])), "$.steps[1].context", "task"),
    "reserved-item": (_with(lambda a: a["context"].append({"id": "instructions", "text": "y"})),
                      "$.steps[1].context[1].id", "reserved"),
    "colon-item": (_with(lambda a: a["context"].append({"id": "solve:t1:msg", "text": "y"})),
                   "$.steps[1].context[1].id", "reserved"),
    "unknown-adapter": (_with(lambda a: a.update(model={"adapter": "gpt-9000"})), "$.steps[1].model.adapter",
                        "gpt-9000"),
    "adapter-without-model": (_with(lambda a: a.update(model={"adapter": "openai", "base_url": "http://127.0.0.1:1/v1"})),
                              "$.steps[1].model.model", "model"),
    "agent-forward-ref": (_with(lambda a: a["context"].append({"id": "r", "from_step": "review"})),
                          "$.steps[1].context[1].from_step", "'review'"),
    "unknown-field": (_with(lambda a: a.update(max_turn=3)), "$.steps[1]", "max_turn"),
}


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_agent_steps_are_refused_naming_the_field(case: str, fmt: str) -> None:
    workflow, path, word = BAD[case]
    text = json.dumps(workflow) if fmt == "json" else yaml.safe_dump(workflow)
    with pytest.raises(WorkflowInvalid) as info:
        parse_workflow(text)
    assert path in info.value.message.replace("`", ""), info.value.message
    assert word in info.value.message, info.value.message


@pytest.mark.parametrize(("step", "ok"), [("solve:t3:c1", True), ("solve:t2", True), ("prep:t1", False),
                                          ("solve:t0", False), ("nope", False)])
def test_a_verifier_may_judge_a_turn_or_call_of_an_agent(step: str, ok: bool) -> None:
    wf = copy.deepcopy(VALID)
    wf["verifiers"] = [{"type": "output_regex", "step": step, "pattern": "x"}]
    if ok:
        assert parse_workflow(wf).verifiers[0].step == step
    else:
        with pytest.raises(WorkflowInvalid, match=r"\$\.verifiers\[0\]\.step"):
            parse_workflow(wf)


def test_python_tool_paths_are_resolved_outside_the_core() -> None:
    fns = check_tool_imports(parse_workflow(VALID))
    assert fns == {("solve", "read_file"): json.loads}
    for path, needle in [("no_such_module_xyz:f", "ModuleNotFoundError"), ("json:no_such_fn", "AttributeError"),
                         ("json:__doc__", "not a callable")]:
        wf = _with(lambda a, p=path: a["tools"][0].update(python=p))  # type: ignore[misc]
        with pytest.raises(WorkflowInvalid) as info:
            check_tool_imports(parse_workflow(wf))
        assert "$.steps[1].tools[0].python" in info.value.message.replace("`", "") and needle in info.value.message
