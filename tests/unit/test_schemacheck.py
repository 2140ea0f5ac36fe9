"""A tool's ``parameters`` and a verifier's ``json_schema`` are checked against their meta-schema at every
load; the verdict is kept per distinct schema, and a kept verdict is the one a fresh check gives."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.schemacheck import _problem, schema_problem
from reel.shared.core.workflow.spec import parse_workflow

BAD = {"type": "object", "properties": {"path": {"type": "strin"}}}


def _workflow(parameters: dict[str, Any], json_schema: dict[str, Any]) -> dict[str, Any]:
    tool = {"name": "read_file", "parameters": parameters, "recorded": {"output": "x"}}
    agent = {"kind": "agent", "id": "solve", "max_turns": 2, "instructions": "go", "tools": [tool],
             "model": {"adapter": "scripted", "turns": [{"text": "done"}]},
             "context": [{"id": "task", "kind": "task", "text": "go"}]}
    return {"name": "wf", "steps": [agent], "verifiers": [{"type": "output_json_schema", "json_schema": json_schema}]}


@pytest.mark.parametrize("schema", [BAD, {"type": "object"}, {"minLength": -1}, {"required": "path"}, {}])
def test_a_kept_verdict_is_the_fresh_one(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) == _problem(copy.deepcopy(schema))
    assert schema_problem(copy.deepcopy(schema)) == _problem(schema)  # asked again (kept): the same


def test_the_same_bad_schema_is_refused_at_every_load() -> None:
    good = {"type": "object"}
    for _ in range(2):
        with pytest.raises(WorkflowInvalid, match=r"parameters are not a JSON Schema: .*strin.*steps\[0\]\.tools\[0\]"):
            parse_workflow(_workflow(BAD, good))
        with pytest.raises(WorkflowInvalid, match=r"invalid JSON Schema: .*strin.*verifiers\[0\]\.json_schema"):
            parse_workflow(_workflow(good, BAD))
    parse_workflow(_workflow(good, good))
