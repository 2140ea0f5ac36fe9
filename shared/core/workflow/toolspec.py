"""What a tool step calls, and what every tool spec says about how its tool runs (docs/workflow.md "Tool output
limits", "Tool errors").

:class:`ToolRunPolicy` holds the fields a tool step's :class:`ToolSpec` and an agent's tool
(:class:`~reel.shared.core.workflow.agentspec.AgentToolSpec`) share — deadline, output cap, environment, retry
safety — written once. Past a tool's output cap the attempt fails with :data:`OUTPUT_TOO_LARGE` or, with
``on_overflow: truncate``, keeps the head, recorded ``truncated``, and a model later shown that output reads
:func:`truncation_note` after it. Nothing is cut silently. Pure (no I/O).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.modelspec import ScriptedOutput

OnOverflow = Literal["fail", "truncate"]
ON_OVERFLOW: tuple[OnOverflow, ...] = ("fail", "truncate")
DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
OUTPUT_TOO_LARGE = "output_too_large"
"""Error kind of an attempt whose output passed its cap with ``on_overflow: fail``."""


class ToolRunPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How any tool runs — the fields a tool step's :class:`ToolSpec` and an agent's tool share.

    An unset cap takes the default of where the output goes — a tool step's (:class:`OutputLimit`'s, unless the
    executor's config sets another) or an agent tool's (:data:`AGENT_TOOL_OUTPUT`): the two differ, and why is
    docs/workflow.md "Tool output limits".

    Attributes:
        timeout_s: deadline of one attempt (s; > 0): a command's process group is killed at it.
        max_output_bytes: cap on a ``command``'s output (stdout and stderr merged, bytes; ≥ 1; an agent's
            ``python`` or ``mcp`` tool: its result text's UTF-8 bytes; unset: see above, :func:`output_limit`).
        on_overflow: past the cap, ``fail`` (error kind ``output_too_large``, retryable) or ``truncate`` (the first
            ``max_output_bytes`` kept, recorded ``truncated``; unset: see above).
        env: variables set in a ``command``'s environment (``NAME: value``); pass_env: names passed through from
            the executor's environment. Nothing else of it reaches the command (:mod:`reel.shared.core.env.toolenv`);
            a ``REEL_NATS_*`` name is refused at load.
        retry_safe: running the tool again has the same effect as running it once (it is idempotent, e.g. keyed by
            ``REEL_IDEMPOTENCY_KEY``, the same for every attempt). After an executor died mid-call, a tool step
            that is not retry-safe adopts its stored output marker, else runs again; an agent's call that is not is
            recorded ``outcome_unknown`` (the model is told). ``reel chaos`` names any tool that ran twice without
            it (docs/chaos.md).
    """

    timeout_s: float = 60.0
    max_output_bytes: int | msgspec.UnsetType = msgspec.UNSET
    on_overflow: OnOverflow | msgspec.UnsetType = msgspec.UNSET
    env: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    pass_env: tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    retry_safe: bool = False


class ToolSpec(ToolRunPolicy, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a tool step calls (and, from :class:`ToolRunPolicy`, how it runs).

    Attributes:
        type: ``recorded`` (returns ``output``), ``scripted`` (``outputs[attempt-1]``),
            ``command`` (runs ``argv``; exit code ≠ 0 fails the attempt).
        name: tool name for logs (e.g. ``bash``).
        input: the recorded tool call (e.g. the command line).
        stdin_from: a step whose output is the command's stdin.
        timeout_s, max_output_bytes, on_overflow, env, pass_env, retry_safe: how it runs
            (:class:`ToolRunPolicy`: deadline, output cap, environment, retry safety).
    """

    type: Literal["recorded", "scripted", "command"]
    name: str = ""
    input: str = ""
    output: str | None = None
    outputs: tuple[ScriptedOutput, ...] = ()
    argv: tuple[str, ...] = ()
    stdin_from: str | None = None


class OutputLimit(msgspec.Struct, frozen=True, kw_only=True):
    """How much output a tool may print (bytes, stdout and stderr merged) and what happens past it (the defaults: a
    tool step's, which the executor's config may change: shared/runtime/config.py)."""

    max_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    on_overflow: OnOverflow = "fail"


AGENT_TOOL_OUTPUT = OutputLimit(max_bytes=1024 * 1024, on_overflow="truncate")
"""An agent tool's default output cap: the model is shown the head and :func:`truncation_note`."""


def check_limits(tool: ToolRunPolicy, at: str) -> None:
    """The checks of a tool's deadline and output cap at field path ``at`` — a tool step's ``tool`` and an agent's
    tool alike.

    Raises:
        WorkflowInvalid: ``timeout_s`` not > 0, or ``max_output_bytes`` < 1 (naming the field).
    """
    if tool.timeout_s <= 0:
        raise WorkflowInvalid(f"timeout_s must be > 0 (at `{at}.timeout_s`)")
    if isinstance(tool.max_output_bytes, int) and tool.max_output_bytes < 1:
        raise WorkflowInvalid(f"max_output_bytes must be >= 1 (at `{at}.max_output_bytes`)")


def output_limit(tool: ToolRunPolicy, default: OutputLimit) -> OutputLimit:
    """``tool``'s own cap and overflow policy, each falling back to ``default`` (the executor's config for a tool
    step, :data:`AGENT_TOOL_OUTPUT` for an agent's tool)."""
    return OutputLimit(
        max_bytes=default.max_bytes if isinstance(tool.max_output_bytes, msgspec.UnsetType) else tool.max_output_bytes,
        on_overflow=default.on_overflow if isinstance(tool.on_overflow, msgspec.UnsetType) else tool.on_overflow)


def truncation_note(kept_bytes: int) -> str:
    """What a model is shown after a truncated tool output's head (pure; nothing silent)."""
    return (f"\n[reel: output truncated — only the first {kept_bytes} bytes are shown "
            "(the tool's max_output_bytes)]")
