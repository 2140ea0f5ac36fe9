"""What environment a tool process starts with (shared/core/env/toolenv.py): an allow-list — pure, no process."""

from __future__ import annotations

from typing import Any

import pytest

from reel.shared.core.env.toolenv import BASE_ENV_KEYS, tool_env
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.spec import parse_workflow

EXECUTOR = {"PATH": "/bin", "HOME": "/home/x", "LANG": "C.UTF-8", "TMPDIR": "/tmp/x",
            "REEL_NATS_USER": "executor", "REEL_NATS_PASSWORD": "pw", "REEL_NATS_CREDS": "/x.creds",
            "OPENAI_API_KEY": "sk-x", "AWS_SHARED_CREDENTIALS_FILE": "/aws", "GITHUB_TOKEN": "ghp"}


def test_a_tool_gets_the_base_its_pass_env_its_env_and_reels_own_and_nothing_else() -> None:
    env = tool_env(EXECUTOR, env={"MODE": "fast", "REEL_RUN_ID": "forged"}, pass_env=["GITHUB_TOKEN", "UNSET_ONE"],
                   reel={"REEL_RUN_ID": "r-1", "REEL_ATTEMPT": "2"})
    assert env == {"PATH": "/bin", "HOME": "/home/x", "LANG": "C.UTF-8", "TMPDIR": "/tmp/x", "GITHUB_TOKEN": "ghp",
                   "MODE": "fast", "REEL_RUN_ID": "r-1", "REEL_ATTEMPT": "2"}
    assert tool_env({}) == {}
    assert set(tool_env(EXECUTOR)) == {"PATH", "HOME", "LANG", "TMPDIR"} <= set(BASE_ENV_KEYS)


def test_a_model_key_crosses_only_when_the_tool_names_it() -> None:
    assert "OPENAI_API_KEY" not in tool_env(EXECUTOR)
    assert tool_env(EXECUTOR, pass_env=["OPENAI_API_KEY"])["OPENAI_API_KEY"] == "sk-x"


def test_nats_credentials_never_cross_even_from_a_caller_that_skipped_the_load_checks() -> None:
    env = tool_env(EXECUTOR, env={"REEL_NATS_TOKEN": "t"}, pass_env=["REEL_NATS_PASSWORD"],
                   reel={"REEL_NATS_USER": "x"})
    assert not [k for k in env if k.startswith("REEL_NATS_")]


def _tool_step(**tool: Any) -> dict[str, Any]:
    return {"name": "t", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "command", "argv": ["env"], **tool}}]}


def _agent(**tool: Any) -> dict[str, Any]:
    return {"name": "t", "steps": [{
        "kind": "agent", "id": "solve", "context": [{"id": "task", "kind": "task", "text": "x"}],
        "model": {"adapter": "scripted", "outputs": ["x"]},
        "tools": [{"name": "sh", "command": ["env"], **tool}]}]}


def _verifier(**v: Any) -> dict[str, Any]:
    return {"name": "t", "steps": [{"kind": "tool", "id": "a", "tool": {"type": "recorded", "output": "x"}}],
            "verifiers": [{"type": "command", "argv": ["true"], **v}]}


@pytest.mark.parametrize(("doc", "at"), [
    (_tool_step(pass_env=["HOME", "REEL_NATS_PASSWORD"]), "$.steps[0].tool.pass_env[1]"),
    (_tool_step(env={"REEL_NATS_USER": "client"}), "$.steps[0].tool.env.REEL_NATS_USER"),
    (_agent(pass_env=["REEL_NATS_NKEY_SEED"]), "$.steps[0].tools[0].pass_env[0]"),
    (_agent(env={"REEL_NATS_CREDS": "/x"}), "$.steps[0].tools[0].env.REEL_NATS_CREDS"),
    (_verifier(pass_env=["REEL_NATS_PASSWORD_FILE"]), "$.verifiers[0].pass_env[0]"),
])
def test_a_nats_name_in_env_or_pass_env_is_refused_at_load_naming_the_field(doc: dict[str, Any], at: str) -> None:
    with pytest.raises(WorkflowInvalid) as exc:
        parse_workflow(doc)
    assert f"(at `{at}`)" in exc.value.message and "REEL_NATS_" in exc.value.message
    assert "NATS credentials" in exc.value.message


def test_bad_names_values_and_env_on_a_tool_that_runs_nothing_are_refused() -> None:
    with pytest.raises(WorkflowInvalid, match=r"not a variable name .*pass_env\[0\]"):
        parse_workflow(_tool_step(pass_env=["A=B"]))
    with pytest.raises(WorkflowInvalid, match="NUL byte"):
        parse_workflow(_tool_step(env={"A": "x\x00y"}))
    with pytest.raises(WorkflowInvalid, match=r"applies only to a tool that runs a command .*tools\[0\]\.env"):
        parse_workflow({**_agent(), "steps": [{**_agent()["steps"][0], "tools": [
            {"name": "py", "python": "m:f", "env": {"A": "b"}}]}]})
    recorded = {"name": "t", "steps": [{"kind": "tool", "id": "a",
                                        "tool": {"type": "recorded", "output": "x", "pass_env": ["HOME"]}}]}
    with pytest.raises(WorkflowInvalid, match=r"applies only .*tool\.pass_env"):
        parse_workflow(recorded)


def test_env_and_pass_env_are_kept_and_an_unchanged_workflow_encodes_as_before() -> None:
    from reel.shared.core.workflow.spec import encode_workflow
    spec = parse_workflow(_tool_step(env={"A": "1"}, pass_env=["GITHUB_TOKEN"]))
    assert spec.steps[0].tool.env == {"A": "1"} and spec.steps[0].tool.pass_env == ("GITHUB_TOKEN",)  # type: ignore[union-attr]
    assert b"pass_env" not in encode_workflow(parse_workflow(_tool_step()))  # the blob (and its sha256) as before
