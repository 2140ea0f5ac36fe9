"""The ``mcp:`` entry of an agent's tools: its load-time checks and its expansion into the listed tools (pure)."""

from __future__ import annotations

import pytest

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.agentspec import AgentToolSpec, expand_mcp
from reel.shared.core.workflow.mcpspec import ListedTool, McpServerSpec, default_prefix, tool_name
from reel.shared.core.workflow.spec import parse_workflow

AGENT = """
name: t
steps:
  - kind: agent
    id: a
    model: {adapter: scripted, turns: [{text: hi}]}
    context: [{id: task, kind: task, text: x}]
    tools:
%s
"""


def _load(tools: str) -> AgentToolSpec:
    spec = parse_workflow((AGENT % tools).encode(), fmt="yaml")
    return spec.steps[0].tools[0]  # type: ignore[union-attr]


def test_an_entry_loads_with_its_server() -> None:
    entry = _load("      - {name: time, mcp: {command: [mcp-server-time], pass_env: [TZ]}}")
    assert entry.type == "mcp" and isinstance(entry.mcp, McpServerSpec) and entry.mcp.pass_env == ("TZ",)


@pytest.mark.parametrize(("tools", "says"), [
    ("      - {mcp: {}}", "exactly one of `command` (stdio) or `url`"),
    ("      - {mcp: {command: [a], url: 'http://x'}}", "exactly one of `command`"),
    ("      - {mcp: {url: 'ftp://x'}}", "must start with http:// or https://"),
    ("      - {mcp: {url: 'http://x', env: {A: b}}}", "`env` applies only to a tool that runs a command"),
    ("      - {mcp: {command: [a], pass_env: [REEL_NATS_PASSWORD]}}", "REEL_NATS_"),
    ("      - {mcp: {command: [a]}, python: 'm:f'}", "exactly one type"),
    ("      - {mcp: {command: [a]}, retry_safe: true}", "goes in its `mcp:`"),
    ("      - {mcp: {command: [a]}, env: {A: b}}", "`env` applies only"),
    ("      - {name: 'a b', mcp: {command: [a]}}", "must match [A-Za-z0-9_-]{1,40}"),
    ("      - {name: x, mcp_tool: y, python: 'm:f'}", "`mcp_tool` is set by the executor"),
    ("      - {name: t, mcp: {command: [a]}}\n      - {name: t, mcp: {url: 'http://x'}}", "duplicate tool name 't__*'"),
])
def test_a_bad_entry_is_refused_naming_its_field(tools: str, says: str) -> None:
    with pytest.raises(WorkflowInvalid) as refused:
        _load(tools)
    assert says in refused.value.message and "$.steps[0].tools[" in refused.value.message


def test_expansion_prefixes_filters_and_takes_retry_safe_from_the_annotations() -> None:
    entry = _load("      - {name: time, timeout_s: 5, mcp: {command: [s], exclude: ['drop*'],"
                  " retry_safe: {write: true, read: false}}}")
    listed = [ListedTool(name="get.now", description="now", input_schema={"type": "object", "properties": {}},
                         read_only=True),
              ListedTool(name="read", read_only=True), ListedTool(name="write"), ListedTool(name="other"),
              ListedTool(name="drop_me", read_only=True), ListedTool(name="idem", idempotent=True),
              ListedTool(name="bad_schema", input_schema={"type": "string"})]
    tools = {t.name: t for t in expand_mcp(entry, listed)}
    assert list(tools) == ["time__get_now", "time__read", "time__write", "time__other", "time__idem",
                           "time__bad_schema"]
    assert tools["time__get_now"].mcp_tool == "get.now" and tools["time__get_now"].description == "now"
    assert {n: t.retry_safe for n, t in tools.items()} == {
        "time__get_now": True, "time__read": False, "time__write": True, "time__other": False, "time__idem": True,
        "time__bad_schema": False}
    assert tools["time__bad_schema"].parameters == {"type": "object"}  # not an object schema: an open one
    assert all(t.timeout_s == 5 for t in tools.values())


def test_names_fit_a_function_name_and_a_default_prefix_is_derived() -> None:
    long = tool_name("p", "x" * 100)
    assert len(long) == 64 and long.startswith("p__xxx") and tool_name("p", "x" * 100) == long
    assert tool_name("p", "x" * 100) != tool_name("p", "x" * 99 + "y")
    assert default_prefix(McpServerSpec(command=("python", "-m", "mcp_server_time"))) == "mcp_server_time"
    assert default_prefix(McpServerSpec(url="https://docs.example.com:8443/mcp")) == "docs_example_com"
