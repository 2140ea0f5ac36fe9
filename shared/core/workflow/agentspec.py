"""The tools of an agent step and their load-time checks (docs/workflow.md; the step's: workflow/spec.py).

An agent step (:class:`reel.shared.core.workflow.spec.AgentStep`) declares ``tools:``, each a
:class:`AgentToolSpec` of exactly one type:

* ``python: "module:function"`` — called as ``fn(**arguments)`` by the executor;
* ``command: [argv…]`` — run without a shell, arguments as JSON on stdin;
* ``recorded: {…}`` — returns recorded results (replay);
* ``builtin: ask_user`` — the model asks a question; a human's answer is the result
  (:mod:`reel.shared.core.input.requestevents`);
* ``mcp: {command: […]}`` / ``mcp: {url: …}`` — every tool an MCP server lists, each a tool of its own
  once the executor listed them (:mod:`reel.shared.core.workflow.mcpspec`, :func:`expand_mcp`).

A tool with ``needs_approval: true`` (or named by the workflow's ``approval`` policy,
:class:`ApprovalPolicy`) runs only once a human approves the call; ``input:`` says who is
asked and what a deadline decides (:class:`InputSpec`).

Everything here is pure: whether a ``python`` path *imports* is checked outside the
core, when the executor loads the workflow (:func:`reel.shared.application.toolimports.check_tool_imports`).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Literal

import msgspec

from reel.shared.core.env.toolenv import check_process_env
from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.input.requestevents import DECISIONS, Decision, RequestKind
from reel.shared.core.workflow.mcpspec import PREFIX, ListedTool, McpServerSpec, check_server, default_prefix, tool_name
from reel.shared.core.workflow.schemacheck import schema_problem
from reel.shared.core.workflow.toolspec import ToolRunPolicy, check_limits

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What chat-completions endpoints accept as a function name."""
PYTHON_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
RESERVED_ITEM_IDS = frozenset({"instructions"})
ToolType = Literal["python", "command", "recorded", "builtin", "mcp"]
ASK_USER_PARAMETERS: dict[str, Any] = {
    "type": "object", "required": ["question"],
    "properties": {"question": {"type": "string", "description": "The question, in full."}}}
ASK_USER_DESCRIPTION = "Ask the user a question and wait for the answer; the answer is this call's result."


def _empty_object_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


class RecordedToolSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a ``recorded`` tool returns: by tool-call id, else ``output``.

    Attributes:
        output: the result of a call not listed below.
        by_call_id: tool-call id → the recorded result text.
        errors: tool-call id → the recorded error text (the model sees an ``is_error`` observation).
    """

    output: str | None = None
    by_call_id: dict[str, str] = {}
    errors: dict[str, str] = {}


class InputSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """How a human is asked about a call (an approval, or an ``ask_user`` question).

    Attributes:
        ask: who or what is asked (free text shown with the request, e.g. ``ops on-call``).
        timeout_s: the request's deadline after it is committed (s); unset: it waits for ever.
        default: what the deadline commits: ``reject`` (default) or ``approve`` for an approval,
            ``reject`` or ``answer`` for a question.
        note: the default's note (a reject: what the model is told) or text (an answer).
    """

    ask: str = ""
    timeout_s: float | None = None
    default: Decision = "reject"
    note: str = ""


class ApprovalPolicy(InputSpec, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The workflow's approval policy: the tools named in ``tools`` (names or ``fnmatch`` patterns, in every
    agent step) need approval, asked as this policy says unless the tool has an ``input:`` of its own."""

    tools: tuple[str, ...] = ()

    def names(self, tool_name: str) -> bool:
        """Whether the policy covers the tool ``tool_name``."""
        return any(fnmatch.fnmatchcase(tool_name, pattern) for pattern in self.tools)


class AgentToolSpec(ToolRunPolicy, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One tool the model of an agent step may call.

    Attributes:
        name: the function name the model sees (``[A-Za-z0-9_-]{1,64}``, unique in the step); of an ``mcp``
            entry: the prefix of its tools' names (``[A-Za-z0-9_-]{1,40}``; unset: :func:`default_prefix`).
        description: shown to the model.
        parameters: JSON Schema of the arguments object (checked as a schema at load).
        python, command, recorded, builtin, mcp: the implementation — exactly one (``builtin``: ``ask_user``;
            ``mcp``: an MCP server, standing for the tools it lists).
        mcp_tool: the server's name of the tool (set by :func:`expand_mcp`, never in a workflow).
        fatal: a failure of this tool (after its attempts) fails the agent step; otherwise
            it is an ``is_error`` observation for the next turn.
        max_attempts: attempts of one call (a retryable failure is retried).
        needs_approval: each call waits for a human's approval before it runs.
        input: how the human is asked (an approval, or ``ask_user``'s question).
        timeout_s, max_output_bytes, on_overflow, env, pass_env, retry_safe: how it runs
            (:class:`~reel.shared.core.workflow.toolspec.ToolRunPolicy`: deadline, output cap, environment, retry
            safety).
    """

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=_empty_object_schema)
    python: str | None = None
    command: tuple[str, ...] | None = None
    recorded: RecordedToolSpec | None = None
    fatal: bool = False
    max_attempts: int = 1
    builtin: Literal["ask_user"] | None = None
    needs_approval: bool = False
    input: InputSpec | None = None
    mcp: McpServerSpec | msgspec.UnsetType = msgspec.UNSET
    mcp_tool: str | msgspec.UnsetType = msgspec.UNSET

    @property
    def type(self) -> ToolType:
        """Which implementation the tool has (valid after :func:`check_tool`)."""
        if isinstance(self.mcp, McpServerSpec):
            return "mcp"
        if self.python is not None:
            return "python"
        if self.builtin is not None:
            return "builtin"
        return "command" if self.command is not None else "recorded"

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the arguments the model sees (``ask_user``'s own for the builtin)."""
        return ASK_USER_PARAMETERS if self.builtin == "ask_user" else self.parameters

    @property
    def about(self) -> str:
        """The description the model sees."""
        return self.description or (ASK_USER_DESCRIPTION if self.builtin == "ask_user" else "")

    def asks(self, policy: ApprovalPolicy | None = None) -> tuple[RequestKind, InputSpec] | None:
        """Whether a call of this tool asks a human first, and how: ``("question", …)`` for ``ask_user``,
        ``("approval", …)`` when it needs approval (its own flag, or ``policy`` names it), else ``None``."""
        covered = policy is not None and policy.names(self.name)
        if self.builtin == "ask_user":
            return "question", self.input or InputSpec()
        if self.needs_approval or covered:
            return "approval", self.input or (policy if covered and policy is not None else InputSpec())
        return None


def check_tool(tool: AgentToolSpec, at: str) -> None:
    """The checks of one agent tool at field path ``at`` (``$.steps[0].tools[2]``).

    Raises:
        WorkflowInvalid: naming the field path of the first problem.
    """
    if isinstance(tool.mcp, McpServerSpec):
        _check_mcp_entry(tool, tool.mcp, at)
        return
    if not TOOL_NAME.match(tool.name):
        raise WorkflowInvalid(f"tool name {tool.name!r} must match [A-Za-z0-9_-]{{1,64}} (at `{at}.name`)")
    if isinstance(tool.mcp_tool, str):
        raise WorkflowInvalid(f"`mcp_tool` is set by the executor for a tool an mcp server lists, never in a"
                              f" workflow (at `{at}.mcp_tool`)")
    kinds = [k for k in ("python", "command", "recorded", "builtin") if getattr(tool, k) is not None]
    if len(kinds) != 1:
        got = f"got {', '.join(kinds)}" if kinds else "got none"
        raise WorkflowInvalid(f"a tool needs exactly one type: `python`, `command`, `recorded`, `builtin` or `mcp`,"
                              f" {got}"
                              f" (at `{at}`)")
    if tool.builtin is not None and (tool.needs_approval or tool.parameters != _empty_object_schema()):
        raise WorkflowInvalid(f"builtin {tool.builtin} takes no `needs_approval` or `parameters` (it always asks;"
                              f" its parameters are {{question}}) (at `{at}`)")
    if tool.input is not None:
        check_input(tool.input, "question" if tool.builtin else "approval", f"{at}.input")
    if tool.python is not None and not PYTHON_PATH.match(tool.python):
        raise WorkflowInvalid(f"python tool path {tool.python!r} must be `module:function` (at `{at}.python`)")
    if tool.command is not None and not tool.command:
        raise WorkflowInvalid(f"command tool needs a non-empty argv (at `{at}.command`)")
    rec = tool.recorded
    if rec is not None and rec.output is None and not rec.by_call_id and not rec.errors:
        raise WorkflowInvalid(f"recorded tool needs `output`, `by_call_id` or `errors` (at `{at}.recorded`)")
    problem = schema_problem(tool.parameters)
    if problem is not None:
        raise WorkflowInvalid(f"parameters are not a JSON Schema: {problem} (at `{at}.parameters`)")
    if tool.parameters.get("type", "object") != "object":
        raise WorkflowInvalid(f"parameters must describe an object (the call's keyword arguments), got type"
                              f" {tool.parameters.get('type')!r} (at `{at}.parameters.type`)")
    if tool.max_attempts < 1:
        raise WorkflowInvalid(f"max_attempts must be >= 1 (at `{at}.max_attempts`)")
    check_limits(tool, at)
    check_process_env(tool, tool.command is not None, at)


def check_input(spec: InputSpec, kind: RequestKind, at: str) -> None:
    """The checks of an ``input:`` (or the approval policy) asking for ``kind``.

    Raises:
        WorkflowInvalid: a deadline that is not > 0, or a default the kind does not take.
    """
    if spec.timeout_s is not None and spec.timeout_s <= 0:
        raise WorkflowInvalid(f"timeout_s must be > 0 (at `{at}.timeout_s`)")
    if spec.default not in DECISIONS[kind]:
        raise WorkflowInvalid(f"an {'ask_user question' if kind == 'question' else 'approval'}'s default must be "
                              f"{' or '.join(DECISIONS[kind])}, got {spec.default!r} (at `{at}.default`)")


def mcp_prefix(tool: AgentToolSpec) -> str:
    """The prefix of an ``mcp`` entry's tool names: its ``name``, else :func:`default_prefix` of its server."""
    assert isinstance(tool.mcp, McpServerSpec)
    return tool.name or default_prefix(tool.mcp)


def _check_mcp_entry(tool: AgentToolSpec, server: McpServerSpec, at: str) -> None:
    others = [k for k in ("python", "command", "recorded", "builtin") if getattr(tool, k) is not None]
    others += ["mcp_tool"] if isinstance(tool.mcp_tool, str) else []
    if others:
        raise WorkflowInvalid(f"a tool needs exactly one type: `python`, `command`, `recorded`, `builtin` or `mcp`,"
                              f" got mcp, {', '.join(others)} (at `{at}`)")
    if tool.name and not PREFIX.match(tool.name):
        raise WorkflowInvalid(f"an mcp entry's name (its tools' prefix) {tool.name!r} must match"
                              f" [A-Za-z0-9_-]{{1,40}} (at `{at}.name`)")
    if tool.description or tool.parameters != _empty_object_schema():
        raise WorkflowInvalid(f"an mcp entry takes no `description` or `parameters` (its server lists them)"
                              f" (at `{at}`)")
    if tool.retry_safe:
        raise WorkflowInvalid(f"an mcp entry's retry_safe goes in its `mcp:` (`retry_safe: true` or"
                              f" {{tool: bool}}; the server's annotations are the default) (at `{at}.retry_safe`)")
    if tool.input is not None:
        check_input(tool.input, "approval", f"{at}.input")
    if tool.max_attempts < 1:
        raise WorkflowInvalid(f"max_attempts must be >= 1 (at `{at}.max_attempts`)")
    check_limits(tool, at)
    check_process_env(tool, False, at)  # the server's env/pass_env go in its `mcp:`
    check_server(server, f"{at}.mcp")


def _listed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A listed tool's ``inputSchema`` if it is a JSON Schema of an object, else an open object schema."""
    if schema_problem(schema) is not None:
        return {"type": "object"}
    return schema if schema.get("type", "object") == "object" else {"type": "object"}


def expand_mcp(entry: AgentToolSpec, listed: list[ListedTool]) -> tuple[AgentToolSpec, ...]:
    """The tools an ``mcp`` entry stands for, given its server's ``tools/list`` (in the server's order; the
    ones its ``include``/``exclude`` keep; a second tool whose name maps to the same model name is left out).
    """
    server = entry.mcp
    assert isinstance(server, McpServerSpec)
    prefix, out, seen = mcp_prefix(entry), [], set()
    for t in listed:
        name = tool_name(prefix, t.name)
        if not server.offers(t.name) or name in seen:
            continue
        seen.add(name)
        out.append(msgspec.structs.replace(
            entry, name=name, description=t.description, parameters=_listed_schema(t.input_schema),
            retry_safe=server.retry_safe_of(t.name, t.hinted_retry_safe), mcp_tool=t.name))
    return tuple(out)
