"""Running one attempt of one tool call of an agent step (docs/workflow.md "Agent steps").

:func:`run_call` is the side effect only: it never commits and never raises for
anything a model or a tool did — the result is the output text, or a
:class:`~reel.shared.core.errors.ToolError` whose ``kind`` and message become the
call's ``attempt_failed`` and the ``is_error`` observation the next turn sees (``unknown_tool``,
``invalid_arguments``, ``tool_error``, ``timeout``, and a command's kinds: it runs on the one command runner
of every tool, :func:`reel.shared.proc.tools.run_command`). Every kind, when it occurs and whether it is
retried, is in one table: docs/workflow.md "Tool errors".

A command's output, and a Python or MCP tool's result text (UTF-8 bytes), is capped as every tool's is
(:class:`~reel.shared.core.workflow.toolspec.ToolRunPolicy`; unset: an agent tool's default,
:data:`~reel.shared.core.workflow.toolspec.AGENT_TOOL_OUTPUT` — why it differs from a tool step's:
docs/workflow.md "Tool output limits").

Every call has an idempotency key, ``<run>/<branch>/<step>`` — stable across the
call's attempts, so an outside service can dedupe a retry — and its attempt number
(:class:`~reel.shared.proc.tools.CallId`, as a tool step's): keywords ``idempotency_key=`` /
``attempt=`` for a Python tool that names them in its signature; in a command's environment the
variables of :meth:`~reel.shared.proc.tools.CallId.env` (with ``REEL_TOOL_ARGS``, the arguments'
JSON text, also sent on stdin; never a shell). A command's environment is an allow-list
(:mod:`reel.shared.core.env.toolenv`): the executor's ``PATH``, ``HOME``, ``LANG``, ``LC_ALL``,
``TMPDIR``, the tool's ``pass_env`` names and ``env`` values, and the variables above — never the
executor's NATS credentials or a model's key unless the tool names it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema

from reel.shared.application.toolimports import (
    PythonTools as PythonTools,  # re-exported: the agent modules import it here
)
from reel.shared.core.chat.messages import ToolCall
from reel.shared.core.errors import ToolCallInvalid, ToolError
from reel.shared.core.run import timers
from reel.shared.core.run.crashpoints import SideEffect
from reel.shared.core.workflow.agentspec import AgentToolSpec
from reel.shared.core.workflow.spec import AgentStep
from reel.shared.core.workflow.toolspec import AGENT_TOOL_OUTPUT, OUTPUT_TOO_LARGE, output_limit, truncation_note
from reel.shared.proc import ledger
from reel.shared.proc.tools import CallId, Command, run_command


class CallContext:
    """Who a call attempt is (:class:`~reel.shared.proc.tools.CallId`: its keys and environment), for its tool.

    Args:
        run_id, branch_id, step_id: the call step; attempt: 1-based.

    ``truncated`` is set once the attempt's command printed more than its cap and its head was kept;
    ``progress``: where an MCP tool's progress goes (``await progress(done, total, message)``), if anywhere;
    ``elicit``: who answers an MCP tool's elicitations (an input request of the run), if anyone.
    """

    def __init__(self, run_id: str, branch_id: str, step_id: str, attempt: int) -> None:
        self.call = CallId(run_id, branch_id, step_id, attempt)
        self.truncated = False
        self.progress: Callable[[float, float | None, str | None], Awaitable[None]] | None = None
        self.elicit: Any = None  # an MCP tool's elicitation answerer (mcptools.Elicit), if it has one
        self.workspace: str | None = None  # the branch's working copy (docs/workspaces.md), when the run has one


@functools.lru_cache(maxsize=1024)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


def _check_arguments(tool: AgentToolSpec, arguments: dict[str, Any]) -> None:
    """Raises ToolError ``invalid_arguments`` naming the first schema violation."""
    validator = _validator(json.dumps(tool.schema, sort_keys=True))
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ToolError(f"invalid arguments for {tool.name}: {error.message} (at `${where}`)",
                        kind="invalid_arguments", retryable=False)


def encode_result(value: Any) -> str:
    """A Python tool's result as the observation text: a str as is, bytes decoded, anything else JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode(errors="replace")
    return json.dumps(value, ensure_ascii=False, default=str)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    p = params.get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


async def _run_python(fn: Callable[..., Any], tool: AgentToolSpec, arguments: dict[str, Any],
                      ctx: CallContext) -> str:
    kwargs = dict(arguments)
    c = ctx.call
    if ledger.enabled():  # reel chaos counts calls (off by default: nothing built then)
        ledger.record(SideEffect(kind="python", run_id=c.run_id, branch_id=c.branch_id, step_id=c.step_id,
                                 attempt=c.attempt, tool=tool.name))
    if _accepts(fn, "idempotency_key"):
        kwargs["idempotency_key"] = c.key
    if _accepts(fn, "attempt"):
        kwargs["attempt"] = c.attempt
    if ctx.workspace is not None and _accepts(fn, "workspace"):
        kwargs["workspace"] = ctx.workspace
    try:
        if inspect.iscoroutinefunction(fn):
            result = await asyncio.wait_for(fn(**kwargs), tool.timeout_s)
        else:
            result = await asyncio.wait_for(asyncio.to_thread(fn, **kwargs), tool.timeout_s)
            if inspect.isawaitable(result):  # a sync wrapper returning a coroutine
                result = await asyncio.wait_for(result, tool.timeout_s)
    except TimeoutError:
        raise ToolError(f"{tool.name} did not return within {tool.timeout_s:g} s", kind="timeout") from None
    except Exception as exc:  # the tool's own failure: an observation for the model
        raise ToolError(f"{tool.name} raised {type(exc).__name__}: {exc}", kind="tool_error") from None
    if isinstance(result, timers.ResumeAfter):  # reel.resume_after(seconds): run this call again later
        raise timers.check_resume(result)
    return _capped(encode_result(result), tool, ctx)


def _capped(text: str, tool: AgentToolSpec, ctx: CallContext) -> str:
    """A Python tool's result text within the cap a command tool's output has (:func:`output_limit`: its own
    ``max_output_bytes`` and ``on_overflow``, else :data:`AGENT_TOOL_OUTPUT`; UTF-8 bytes): past it, the head and
    :func:`truncation_note` (``on_overflow: fail``: a ``output_too_large`` ToolError)."""
    limit = output_limit(tool, AGENT_TOOL_OUTPUT)
    if len(text) * 4 <= limit.max_bytes:  # a str of n code points encodes to at most 4n bytes
        return text
    data = text.encode()
    if len(data) <= limit.max_bytes:
        return text
    if limit.on_overflow == "fail":
        raise ToolError(f"{tool.name} returned {len(data)} bytes, over its max_output_bytes of "
                        f"{limit.max_bytes}", kind=OUTPUT_TOO_LARGE)
    ctx.truncated = True
    return data[:limit.max_bytes].decode(errors="ignore") + truncation_note(limit.max_bytes)


async def _run_command(tool: AgentToolSpec, arguments_text: str, ctx: CallContext) -> str:
    assert tool.command is not None
    call = dataclasses.replace(ctx.call, tool=tool.name)
    cmd = Command(argv=tool.command, name=tool.name, timeout_s=tool.timeout_s, spec=tool,
                  reel=call.env(REEL_TOOL_ARGS=arguments_text, **_workspace_env(ctx)),
                  limit=output_limit(tool, AGENT_TOOL_OUTPUT))
    with await run_command(cmd, stdin=arguments_text.encode()) as out:
        text = out.read().decode("utf-8", errors="replace")
        ctx.truncated = out.truncated
        try:
            asked = None if out.truncated else timers.resume_request(text)
        except ValueError as exc:
            raise ToolError(str(exc), kind="invalid_resume", retryable=False) from None
        if asked is not None:  # {"reel": {"resume_after_s": N}}: run this call again later
            raise timers.ResumeRequested(*asked)
        return text + truncation_note(out.size_bytes) if out.truncated else text


def _workspace_env(ctx: CallContext) -> dict[str, str]:
    return {} if ctx.workspace is None else {"REEL_WORKSPACE": ctx.workspace}


def _run_recorded(tool: AgentToolSpec, call_id: str) -> str:
    rec = tool.recorded
    assert rec is not None
    if call_id in rec.errors:
        raise ToolError(rec.errors[call_id], kind="tool_error", retryable=False)
    if call_id in rec.by_call_id:
        return rec.by_call_id[call_id]
    if rec.output is not None:
        return rec.output
    raise ToolError(f"{tool.name} has no recorded result for call {call_id!r}", kind="tool_error", retryable=False)


async def run_call(agent: AgentStep, call: ToolCall, ctx: CallContext, python_tools: PythonTools) -> str:
    """Run attempt ``ctx.call.attempt`` of ``call`` (name and raw arguments as declared); its output text.

    Raises:
        ToolError: with the kinds of the module docstring (never anything else for what a model
            or a tool did).
    """
    tool = next((t for t in agent.tools if t.name == call.name), None)
    if tool is None:
        names = ", ".join(t.name for t in agent.tools) or "none"
        raise ToolError(f"no tool named {call.name!r} (the tools are: {names})", kind="unknown_tool",
                        retryable=False)
    try:
        arguments = call.parsed_arguments()
    except ToolCallInvalid as exc:
        raise ToolError(exc.message, kind="invalid_arguments", retryable=False) from None
    _check_arguments(tool, arguments)
    if tool.builtin is not None:  # ask_user is answered by a human (shared/core/input/requesting.py), never run
        raise ToolError(f"{tool.name} was not asked: its call has no input request", kind="tool_error", retryable=False)
    if tool.python is not None:
        fn = python_tools.get((agent.id, tool.name))
        if fn is None:  # the workflow was loaded without resolving its tools: a bug, not the model's
            raise ToolError(f"python tool {tool.python!r} was not resolved at load", kind="tool_error")
        return await _run_python(fn, tool, arguments, ctx)
    if tool.command is not None:
        return await _run_command(tool, call.arguments if call.arguments.strip() else "{}", ctx)
    if tool.type == "mcp":  # a tool an MCP server lists (services/executor/mcptools.py)
        from . import mcptools  # the mcp SDK is an optional extra: imported by a workflow that names one
        c = ctx.call
        if ledger.enabled():
            ledger.record(SideEffect(kind="mcp", run_id=c.run_id, branch_id=c.branch_id, step_id=c.step_id,
                                     attempt=c.attempt, tool=tool.name))
        return _capped(await mcptools.servers().call(tool, arguments, on_progress=ctx.progress,
                                                     on_elicit=ctx.elicit), tool, ctx)
    return _run_recorded(tool, call.id)
