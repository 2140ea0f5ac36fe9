"""What a tool step calls, and how much output it may print (docs/workflow.md "Tool steps").

A ``command`` tool's output (stdout and stderr merged) is capped: ``max_output_bytes`` per
tool, else the executor's default (``REEL_TOOL_MAX_OUTPUT_BYTES``, 8 MiB; shared/runtime/config.py).
Past the cap the attempt fails with :data:`OUTPUT_TOO_LARGE` or, with ``on_overflow:
truncate``, succeeds with the head kept and the success recorded ``truncated``
(``attempt_succeeded.truncated``), and a model later shown that output reads
:func:`truncation_note` after it. Nothing is cut silently. Pure (no I/O).
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.modelspec import ScriptedOutput

OnOverflow = Literal["fail", "truncate"]
ON_OVERFLOW: tuple[OnOverflow, ...] = ("fail", "truncate")
DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
OUTPUT_TOO_LARGE = "output_too_large"
"""Error kind of an attempt whose output passed its cap with ``on_overflow: fail``."""


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a tool step calls.

    Attributes:
        type: ``recorded`` (returns ``output``), ``scripted`` (``outputs[attempt-1]``),
            ``command`` (runs ``argv``; exit code ≠ 0 fails the attempt).
        name: tool name for logs (e.g. ``bash``).
        input: the recorded tool call (e.g. the command line).
        timeout_s: deadline of a ``command`` (s).
        stdin_from: a step whose output is the command's stdin.
        max_output_bytes: cap on a ``command``'s output (stdout and stderr merged, bytes; ≥ 1). Unset: the
            executor's default (``REEL_TOOL_MAX_OUTPUT_BYTES``, 8 MiB; :func:`output_limit`).
        on_overflow: past the cap, ``fail`` the attempt (error kind ``output_too_large``, retryable: the
            step's ``max_attempts`` applies) or ``truncate``: keep the first ``max_output_bytes`` and record
            the success ``truncated``. Unset: the executor's default (``REEL_TOOL_ON_OVERFLOW``, ``fail``).
        env: variables set in a ``command``'s environment (``NAME: value``); pass_env: names passed through
            from the executor's environment. Nothing else of it reaches the command
            (:mod:`reel.shared.core.env.toolenv`); a ``REEL_NATS_*`` name is refused at load.
        retry_safe: running the command again has the same effect as running it once (it is idempotent,
            e.g. keyed by ``REEL_IDEMPOTENCY_KEY``, the same for every attempt). A tool step runs at least once
            per attempt either way (after an executor crash mid-command it runs again); ``reel chaos`` accepts the
            repeats of a retry-safe tool and names any other tool that ran twice (docs/chaos.md).
    """

    type: Literal["recorded", "scripted", "command"]
    name: str = ""
    input: str = ""
    output: str | None = None
    outputs: tuple[ScriptedOutput, ...] = ()
    argv: tuple[str, ...] = ()
    timeout_s: float = 60.0
    stdin_from: str | None = None
    max_output_bytes: int | msgspec.UnsetType = msgspec.UNSET
    on_overflow: OnOverflow | msgspec.UnsetType = msgspec.UNSET
    env: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    pass_env: tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    retry_safe: bool = False


class OutputLimit(msgspec.Struct, frozen=True, kw_only=True):
    """How much output a tool may print (bytes, stdout and stderr merged) and what happens past it."""

    max_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    on_overflow: OnOverflow = "fail"


class Capped(Protocol):
    """A tool spec with a deadline and an output cap: :class:`ToolSpec`,
        :class:`~reel.shared.core.workflow.agentspec.AgentToolSpec`."""

    @property
    def timeout_s(self) -> float: ...

    @property
    def max_output_bytes(self) -> int | msgspec.UnsetType: ...

    @property
    def on_overflow(self) -> OnOverflow | msgspec.UnsetType: ...


def check_limits(tool: Capped, at: str) -> None:
    """The checks of a tool's deadline and output cap at field path ``at`` — a tool step's ``tool`` and an agent's
    tool alike.

    Raises:
        WorkflowInvalid: ``timeout_s`` not > 0, or ``max_output_bytes`` < 1 (naming the field).
    """
    if tool.timeout_s <= 0:
        raise WorkflowInvalid(f"timeout_s must be > 0 (at `{at}.timeout_s`)")
    if isinstance(tool.max_output_bytes, int) and tool.max_output_bytes < 1:
        raise WorkflowInvalid(f"max_output_bytes must be >= 1 (at `{at}.max_output_bytes`)")


def output_limit(tool: Capped, default: OutputLimit) -> OutputLimit:
    """``tool``'s own cap and overflow policy, each falling back to ``default`` (the executor's config)."""
    return OutputLimit(
        max_bytes=default.max_bytes if isinstance(tool.max_output_bytes, msgspec.UnsetType) else tool.max_output_bytes,
        on_overflow=default.on_overflow if isinstance(tool.on_overflow, msgspec.UnsetType) else tool.on_overflow)


def truncation_note(kept_bytes: int) -> str:
    """What a model is shown after a truncated tool output's head (pure; nothing silent)."""
    return (f"\n[reel: output truncated — only the first {kept_bytes} bytes are shown "
            "(the tool's max_output_bytes)]")
