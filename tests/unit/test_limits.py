"""The depth and size limits on client input (shared/core/wire/limits.py; docs/subjects.md, "Limits")."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from reel.shared.core.chat.messages import ToolCall
from reel.shared.core.errors import InvalidCommand, ToolCallInvalid, WorkflowInvalid
from reel.shared.core.input.requesting import parsed
from reel.shared.core.wire.commands import RespondRun, StartRun, decode_command
from reel.shared.core.wire.consumerrules import Refused, vet
from reel.shared.core.wire.limits import MAX_COMMAND_BYTES, MAX_DEPTH, json_deeper_than, value_depth
from reel.shared.core.workflow.spec import load_workflow, parse_workflow

_leaf = st.one_of(st.none(), st.integers(), st.text(alphabet='ab[]{}"\\\n', max_size=6))
_values = st.recursive(_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(alphabet='k[]"\\', max_size=3), inner, max_size=3)),
    max_leaves=60)


def nested(depth: int) -> Any:
    """``depth`` levels of objects and arrays, alternating (keys hold brackets and quotes)."""
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a]\"[": value}
    return value


def nested_text(depth: int) -> str:
    """The JSON text of :func:`nested` (built as text: ``json.dumps`` itself recurses)."""
    opens = "".join("[" if i % 2 else '{"a]\\\"[": ' for i in reversed(range(depth)))
    return opens + "1" + "".join("]" if i % 2 else "}" for i in range(depth))


@given(_values, st.sampled_from([0, 1, 2, 3, 5, 8]))
def test_the_text_scan_agrees_with_the_decoded_depth(value: Any, limit: int) -> None:
    text = json.dumps(value)
    assert json_deeper_than(text, limit) == (value_depth(value, 10**6) > limit)
    assert json_deeper_than(text.encode(), limit) == (value_depth(value, 10**6) > limit)


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 1_000, 100_000])
def test_the_limit_is_exact(depth: int) -> None:
    text = nested_text(depth)
    assert json_deeper_than(text) is (depth > MAX_DEPTH)
    if depth < 500:
        assert text == json.dumps(nested(depth))
        assert (value_depth(json.loads(text)) > MAX_DEPTH) is (depth > MAX_DEPTH)


def test_a_mebibyte_body_is_measured_in_milliseconds() -> None:
    bodies = [b"[" + b"[],[1],{}," * 90_000 + b"[]]", json.dumps(["a[{\\\"" * 3] * 60_000).encode(),
              b"[" * 500_000 + b"]" * 500_000, b'"' + b"x" * MAX_COMMAND_BYTES + b'"']
    for body in bodies:
        started = time.perf_counter()
        json_deeper_than(body)
        assert time.perf_counter() - started < 0.25, body[:20]


def test_commands_nested_too_deep_or_too_big_are_refused_before_decoding() -> None:
    deep = b'{"workflow": {"name": "w", "steps": [], "source": ' + b'{"a": ' * 10_000 + b"1" + b"}" * 10_002
    with pytest.raises(InvalidCommand, match=f"^nested deeper than {MAX_DEPTH} "):
        decode_command(deep, StartRun)
    args = json.dumps({"run_id": "r-1", "request_id": "q", "decision": "approve", "arguments": nested(MAX_DEPTH)})
    with pytest.raises(InvalidCommand, match="nested deeper than"):
        decode_command(args.encode(), RespondRun)
    ok = json.dumps({"run_id": "r-1", "request_id": "q", "decision": "approve", "arguments": nested(MAX_DEPTH - 3)})
    assert decode_command(ok.encode(), RespondRun).arguments is not None
    with pytest.raises(InvalidCommand, match="over the limit of 1048576"):
        decode_command(b'{"run_id": "' + b"x" * MAX_COMMAND_BYTES + b'"}', RespondRun)


def test_workflow_documents_nested_too_deep_are_refused_json_yaml_and_parsed(tmp_path: Any) -> None:
    for text in ['{"name": "w", "steps": [], "source": ' + nested_text(5_000) + "}",
                 "name: w\nsteps: []\nsource:\n  a: " + "[" * 5_000 + "]" * 5_000]:
        with pytest.raises(WorkflowInvalid, match="nested deeper than 64"):
            parse_workflow(text)
        path = tmp_path / "w.yaml"
        path.write_text(text)
        with pytest.raises(WorkflowInvalid, match="nested deeper than 64"):
            load_workflow(path, env={})
    with pytest.raises(WorkflowInvalid, match="nested deeper than 64"):
        parse_workflow({"name": "w", "steps": [], "source": nested(MAX_DEPTH + 1)})


def test_a_models_tool_call_arguments_nested_too_deep_are_an_invalid_call() -> None:
    deep = '{"x": ' + nested_text(5_000) + "}"
    with pytest.raises(ToolCallInvalid, match="nested deeper than 64"):
        ToolCall(id="c1", name="t", arguments=deep).parsed_arguments()
    assert parsed(deep) is None
    assert parsed(json.dumps({"x": nested(10)})) == {"x": nested(10)}


def test_a_consumer_request_nested_too_deep_is_refused_before_it_is_decoded() -> None:
    body = b'{"stream_name": "S", "config": {"deliver_subject": "_INBOX.x", "x": ' + b"[" * 900 + b"]" * 900 + b"}}"
    refused = vet("S", body, {"S"})
    assert isinstance(refused, Refused) and "nested deeper than 64" in refused.reason, refused


def test_a_yaml_alias_bomb_is_measured_by_its_distinct_nodes() -> None:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    doc = yaml.safe_load("\n".join(lines))
    started = time.perf_counter()
    assert value_depth(doc) == 10  # 9**9 leaves expanded; 9 distinct lists here
    assert time.perf_counter() - started < 1
    selfish: list[Any] = []
    selfish.append(selfish)
    assert value_depth(selfish) == MAX_DEPTH + 1
