"""An unknown field's error names the field meant, followed along its path through the document."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.lab.labspec import LabSpecError, parse_spec
from reel.shared.core.workflow.fieldhint import MAX_LISTED, unknown_field_hint
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow

AGENT = "{kind: agent, id: a, model: {adapter: scripted}, tools: [%s]}"


@pytest.mark.parametrize(("doc", "says"), [
    ("name: x\nbudget_token: 10\nsteps: []", "unknown field `budget_token` (did you mean `budget_tokens`?)"),
    ("name: x\nsteps:\n  - {kind: model, id: a, instruction: hi, model: {adapter: scripted, output: hi}}",
     "at `$.steps[0]` (did you mean `instructions`?)"),
    # the step's kind picks the struct: a tool step has no `instructions` to offer
    ("name: x\nsteps:\n  - {kind: tool, id: a, instruction: hi, tool: {type: command, argv: [ls]}}",
     "at `$.steps[0]` (fields here: `id`, `tool`"),
    ("name: x\nsteps:\n  - {kind: tool, id: a, tool: {type: command, argv: [ls], timeout: 3}}",
     "at `$.steps[0].tool` (did you mean `timeout_s`?)"),
    ("name: x\nsteps:\n  - " + AGENT % "{name: t, description: d, parameters: {}, comand: [ls]}",
     "at `$.steps[0].tools[0]` (did you mean `command`?)"),
    ("name: x\nsteps:\n  - " + AGENT % "{name: t, description: d, parameters: {}, zzz: [ls]}",
     "(a tool's type is one of `python`, `command`, `recorded` or `builtin`)"),
    ("name: x\nworkspace: {form: .}\nsteps: []", "at `$.workspace` (did you mean `from`?)"),  # its YAML name
    ('{"name": "x", "stepz": []}', "unknown field `stepz` (did you mean `steps`?)"),
])
def test_a_workflows_unknown_field_names_the_one_meant(doc: str, says: str) -> None:
    with pytest.raises(WorkflowInvalid) as info:
        parse_workflow(doc)
    assert says in info.value.message, info.value.message


@pytest.mark.parametrize(("doc", "says"), [
    ("name: x\nsteps: []\nverifiers:\n  - {type: output_regexp, name: v, pattern: hi}",
     "Invalid enum value 'output_regexp' - at `$.verifiers[0].type` (did you mean `output_regex`?)"),
    ("name: x\nsteps:\n  - {kind: tool, id: a, tool: {type: zzz, argv: [ls]}}",
     "at `$.steps[0].tool.type` (one of: `command`, `recorded`, `scripted`)"),
])
def test_a_refused_value_names_the_one_meant_or_those_allowed(doc: str, says: str) -> None:
    with pytest.raises(WorkflowInvalid) as info:
        parse_workflow(doc)
    assert says in info.value.message, info.value.message


def test_a_name_close_to_none_lists_the_fields_of_a_small_struct_only() -> None:
    with pytest.raises(WorkflowInvalid) as info:
        parse_workflow("name: x\nsteps:\n  - {kind: agent, id: a, model: {adapter: scripted}, qqqqqq: 1}")
    assert info.value.message.endswith(
        "unknown field `qqqqqq` - at `$.steps[0]` (fields here: `id`, `model`, `instructions`, `context`, `policy`, "
        "`tools`, `max_turns`, `max_attempts`, `max_parallel_tools`, `on_truncated`)"), info.value.message
    wide = msgspec.defstruct("Wide", [(f"f{i}", int) for i in range(MAX_LISTED + 1)], forbid_unknown_fields=True)
    assert unknown_field_hint("Object contains unknown field `qqqqqq`", wide, {}) is None
    assert unknown_field_hint("Object contains unknown field `f1x`", wide, {}) == "did you mean `f1`?"


@pytest.mark.parametrize(("message", "data"), [
    ("Expected `int`, got `str` - at `$.budget_tokens`", {}),  # not an unknown field
    ("Object contains unknown field `x` - at `$.steps[3]`", {"steps": []}),  # no such step in the document
    ("Object contains unknown field `x` - at `$.steps[0]`", {"steps": [{"kind": "nope"}]}),  # no such kind
    ("Object contains unknown field `x` - at `$.name.more`", {"name": "n"}),  # a path through a string
])
def test_no_hint_where_the_path_cannot_be_followed(message: str, data: object) -> None:
    assert unknown_field_hint(message, WorkflowSpec, data) is None


def test_a_lab_specs_unknown_field_names_the_one_meant(tmp_path: Path) -> None:
    with pytest.raises(LabSpecError) as info:
        parse_spec("runs: {ids: [r]}\nat: {trun: 1}\nedit: {model: m}", folder=tmp_path, env={})
    assert "(did you mean `turn`?)" in info.value.message, info.value.message
