"""One attempt of one agent tool call (services/executor/agenttools.py): no NATS involved, real processes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from reel.services.executor.agenttools import CallContext, encode_result, run_call
from reel.shared.core.chat.messages import ToolCall
from reel.shared.core.errors import ToolError, WorkflowInvalid
from reel.shared.core.workflow.spec import AgentStep, parse_workflow
from reel.shared.core.workflow.toolspec import OUTPUT_TOO_LARGE, truncation_note
from tests.support import print_bytes


def _agent(tools: list[dict[str, Any]]) -> AgentStep:
    spec = parse_workflow({"name": "t", "steps": [{
        "kind": "agent", "id": "solve", "context": [{"id": "task", "kind": "task", "text": "x"}],
        "model": {"adapter": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "T_KEY"},
        "tools": tools}]})
    assert spec.model_key_names() == {"T_KEY"}
    step = spec.steps[0]
    assert isinstance(step, AgentStep)
    return step


CTX = CallContext("r-1", "main", "solve:t1:c0", 2)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "tags": {"type": "array",
                                                                            "items": {"type": "string"}}},
          "required": ["n"]}


async def _call(agent: AgentStep, name: str, args: str, fns: dict[str, Any] | None = None) -> str:
    return await run_call(agent, ToolCall(id="call_1", name=name, arguments=args), CTX,
                          {("solve", k): v for k, v in (fns or {}).items()})


async def _fails(agent: AgentStep, name: str, args: str, fns: dict[str, Any] | None = None) -> ToolError:
    with pytest.raises(ToolError) as err:
        await _call(agent, name, args, fns)
    return err.value


async def test_python_tools_get_the_key_and_attempt_when_they_name_them_and_results_are_json() -> None:
    async def keyed(n: int, *, idempotency_key: str, attempt: int) -> dict[str, Any]:
        return {"n": n, "key": idempotency_key, "attempt": attempt}

    def plain(n: int, **rest: Any) -> list[Any]:
        return [n, sorted(rest)]  # **kwargs is not "naming" them: nothing extra is passed

    agent = _agent([{"name": "keyed", "python": "m:keyed", "parameters": SCHEMA},
                    {"name": "plain", "python": "m:plain", "parameters": SCHEMA}])
    fns = {"keyed": keyed, "plain": plain}
    assert json.loads(await _call(agent, "keyed", '{"n": 3}', fns)) == {"n": 3, "key": "r-1/main/solve:t1:c0",
                                                                       "attempt": 2}
    assert json.loads(await _call(agent, "plain", '{"n": 4}', fns)) == [4, []]
    assert encode_result("text") == "text" and encode_result(b"raw") == "raw" and encode_result(None) == "null"


async def test_what_the_model_got_wrong_is_an_error_result_naming_it() -> None:
    def boom(n: int) -> str:
        raise RuntimeError(f"no {n}")

    agent = _agent([{"name": "boom", "python": "m:boom", "parameters": SCHEMA}])
    fns = {"boom": boom}
    unknown = await _fails(agent, "nope", "{}", fns)
    assert (unknown.kind, unknown.retryable) == ("unknown_tool", False) and "the tools are: boom" in unknown.message
    for args, where in (('{"n": "x"}', "(at `$.n`)"), ('{"n": 1, "tags": [1]}', "(at `$.tags[0]`)"),
                        ("{}", "(at `$`)")):
        bad = await _fails(agent, "boom", args, fns)
        assert (bad.kind, bad.retryable) == ("invalid_arguments", False) and bad.message.endswith(where), bad.message
    assert (await _fails(agent, "boom", "[1]", fns)).kind == "invalid_arguments"
    raised = await _fails(agent, "boom", '{"n": 1}', fns)
    assert (raised.kind, raised.retryable, raised.message) == ("tool_error", True, "boom raised RuntimeError: no 1")


async def test_a_sync_tool_past_its_timeout_fails_retryably() -> None:
    def slow(n: int) -> str:
        time.sleep(0.5)  # its thread cannot be killed: abandoned, it finishes on its own
        return "late"

    agent = _agent([{"name": "slow", "python": "m:slow", "parameters": SCHEMA, "timeout_s": 0.05}])
    err = await _fails(agent, "slow", '{"n": 1}', {"slow": slow})
    assert (err.kind, err.retryable) == ("timeout", True)


async def test_command_tools_get_arguments_on_stdin_and_env_but_never_a_models_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_KEY", "sk-never-seen")
    monkeypatch.setenv("REEL_NATS_PASSWORD", "pw-never-seen")
    monkeypatch.setenv("T_PASSED", "passed")
    script = ("import json, os, sys; a = sys.stdin.read(); print(json.dumps({'stdin': a,"
              " 'env': os.environ['REEL_TOOL_ARGS'], 'key': os.environ['REEL_IDEMPOTENCY_KEY'],"
              " 'attempt': os.environ['REEL_ATTEMPT'], 'secret': os.environ.get('T_KEY'),"
              " 'names': sorted(os.environ)}));"
              " sys.exit(int(json.loads(a).get('n', 0)))")
    agent = _agent([{"name": "cmd", "command": [sys.executable, "-c", script], "parameters": SCHEMA,
                     "env": {"T_SET": "v"}, "pass_env": ["T_PASSED", "T_UNSET"]}])
    out = json.loads(await _call(agent, "cmd", '{"n": 0}'))
    names = set(out.pop("names"))
    assert out == {"stdin": '{"n": 0}', "env": '{"n": 0}', "key": "r-1/main/solve:t1:c0", "attempt": "2",
                   "secret": None}
    reel = {"REEL_TOOL_ARGS", "REEL_IDEMPOTENCY_KEY", "REEL_ATTEMPT", "REEL_RUN_ID", "REEL_BRANCH_ID",
            "REEL_STEP_ID", "REEL_TOOL_NAME"}
    assert names - {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "LC_CTYPE"} == reel | {"T_SET", "T_PASSED"}
    failed = await _fails(agent, "cmd", '{"n": 3}')
    assert failed.kind == "exit_3" and failed.message.startswith("cmd exited 3: {")


async def test_recorded_tools_answer_by_call_id() -> None:
    agent = _agent([{"name": "rec", "recorded": {"output": "default", "by_call_id": {"call_1": "mine"}}},
                    {"name": "err", "recorded": {"errors": {"call_1": "it failed"}}}])
    assert await _call(agent, "rec", "{}") == "mine"
    err = await _fails(agent, "err", "{}")
    assert (err.kind, err.message) == ("tool_error", "it failed")
    assert msgspec.json.decode(encode_result({"a": 1})) == {"a": 1}


PRINTER = str(Path(__file__).parents[1] / "support" / "print_bytes.py")


async def test_a_command_past_its_cap_shows_the_model_its_head_marked_truncated() -> None:
    agent = _agent([{"name": "big", "command": [sys.executable, PRINTER, "5000"], "max_output_bytes": 1000},
                    {"name": "whole", "command": [sys.executable, PRINTER, "1000"], "max_output_bytes": 1000},
                    {"name": "strict", "command": [sys.executable, PRINTER, "5000"], "max_output_bytes": 1000,
                     "on_overflow": "fail"}])
    seen = await _call(agent, "big", "{}")
    assert seen == print_bytes.expected(1000).decode() + truncation_note(1000) and CTX.truncated
    assert "truncated" in truncation_note(1000) and "1000" in truncation_note(1000)
    assert await _call(agent, "whole", "{}") == print_bytes.expected(1000).decode() and not CTX.truncated
    failed = await _fails(agent, "strict", "{}")
    assert failed.kind == OUTPUT_TOO_LARGE and failed.retryable and "1000" in failed.message


def test_an_agent_tool_cap_below_one_byte_is_refused_at_load() -> None:
    with pytest.raises(WorkflowInvalid, match=r"max_output_bytes must be >= 1 \(at `\$\.steps\[0\]\.tools\[0\]"):
        _agent([{"name": "big", "command": ["true"], "max_output_bytes": 0}])


@pytest.mark.parametrize(("field", "value", "says"), [("timeout_s", 0, "timeout_s must be > 0"),
                                                      ("timeout_s", -1, "timeout_s must be > 0"),
                                                      ("max_output_bytes", 0, "max_output_bytes must be >= 1")])
def test_a_tool_step_and_an_agent_tool_refuse_the_same_limits_alike(field: str, value: int, says: str) -> None:
    with pytest.raises(WorkflowInvalid) as plain:
        parse_workflow({"name": "w", "steps": [{"kind": "tool", "id": "t", "tool": {
            "type": "command", "argv": ["true"], field: value}}]})
    with pytest.raises(WorkflowInvalid) as agent:
        _agent([{"name": "x", "command": ["true"], field: value}])
    assert f"{says} (at `$.steps[0].tool.{field}`)" in plain.value.message
    assert f"{says} (at `$.steps[0].tools[0].{field}`)" in agent.value.message
