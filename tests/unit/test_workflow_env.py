"""``${NAME}`` / ``${NAME:-default}`` in workflow files (``reel run``; docs/workflow.md) — pure, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.spec import expand_env, load_workflow

DOC = """
name: ${NAME:-env-demo}
steps:
  - kind: model
    id: plan
    max_attempts: 2
    model: {adapter: scripted, outputs: ["echo ${WHO}", "literal $${WHO}"], name: "${MODEL:-m-${WHO}}"}
"""


def test_expand_env_replaces_strings_only() -> None:
    doc = {"a": "${X}", "b": ["${Y:-d}", 3, None, "$${X}"], "${X}": "k"}
    assert expand_env(doc, {"X": "x"}) == {"a": "x", "b": ["d", 3, None, "${X}"], "${X}": "k"}


def test_unset_without_default_names_the_variable_and_field() -> None:
    with pytest.raises(WorkflowInvalid) as exc:
        expand_env({"steps": [{"model": {"base_url": "${BASE}"}}]}, {})
    assert "BASE is not set" in exc.value.message and "`$.steps[0].model.base_url`" in exc.value.message


def test_load_workflow_with_and_without_env(tmp_path: Path) -> None:
    p = tmp_path / "w.yaml"
    p.write_text(DOC)
    spec = load_workflow(p, env={"WHO": "ada"})
    step = spec.steps[0]
    assert spec.name == "env-demo"
    assert step.model.outputs == ("echo ada", "literal ${WHO}") and step.model.name == "m-ada"  # type: ignore[union-attr]
    untouched = load_workflow(p)  # without env (ReelClient users, older callers): taken as written
    assert untouched.name == "${NAME:-env-demo}"
    with pytest.raises(WorkflowInvalid, match=r"w\.yaml: .*WHO is not set"):
        load_workflow(p, env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(WorkflowInvalid, match="YAML syntax error"):  # the usual message, env or not
        load_workflow(bad, env={})


def test_a_value_holding_a_reference_does_not_loop() -> None:
    assert expand_env("${X}", {"X": "a${X}"}).startswith("aaaa")
