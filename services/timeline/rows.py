"""The cells of ``reel show``'s attempt table that need more than the attempt: what a tool row ran, its exit
code, real latency, packed tokens, drop reasons, and the notes printed whole below the table.

Pure helpers over the folded state and (when the CLI has it) the run's workflow spec:

* :func:`call_cells` — a tool row's command (a ``command`` tool's argv, the ``command``
  argument of a shell-like call, else the call's raw JSON arguments) and exit code (``0``
  for a succeeded ``command`` tool, ``N`` from a failure's ``exit_N`` kind or "exited N"
  message, ``""`` where the tool has none: recorded, scripted and Python tools);
* :func:`latency_cell` — the attempt's own call latency (``usage.latency_ms``: the model
  call or tool run alone) with precision to match, beside the wall time from its intent's
  commit to its outcome's (``finished_ms - dispatched_ms``, ms). A replayed turn or a
  recorded tool answers from memory in microseconds, which the old one-decimal column
  printed as ``0.0``;
* :func:`drop_summary` — a partition's dropped items grouped by reason.
"""

from __future__ import annotations

import re
import shlex

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.run.events import ContextPartition
from reel.shared.core.run.state import AttemptState, BranchState
from reel.shared.core.run.views import AttemptView, StepView
from reel.shared.core.workflow.spec import ToolStep, WorkflowSpec

_EXITED = re.compile(r"\bexited (-?\d+)\b")


def attempt_state(branch: BranchState, a: AttemptView) -> AttemptState | None:
    """The folded record of the view's attempt (for its timestamps), if the branch has it."""
    for s in branch.attempts.get(a.step_id, ()):
        if s.attempt == a.attempt:
            return s
    return None


def _is_command_tool(spec: WorkflowSpec | None, step: StepView) -> tuple[bool, tuple[str, ...]]:
    """Whether the step's tool runs a command, and the argv when the workflow fixes it (plain tool steps)."""
    if spec is None:
        return False, ()
    try:
        if isinstance(step.parent_step, str):
            agent = spec.agent(step.parent_step)
            tool = next((t for t in agent.tools if t.name == step.tool_name), None)
            return (tool is not None and tool.command is not None), tuple(tool.command or ()) if tool else ()
        decl = spec.step(step.step_id)
    except (KeyError, ValueError):
        return False, ()
    if isinstance(decl, ToolStep) and decl.tool.type == "command":
        return True, decl.tool.argv
    return False, ()


def _arguments_text(branch: BranchState, step: StepView) -> str:
    d = turnfold.declared(branch, step.step_id)
    if d is None:
        return ""
    if d.arguments is None:
        return f"<{d.arguments_ref.size_bytes} B of arguments>" if d.arguments_ref else ""
    try:
        parsed = msgspec.json.decode(d.arguments)
    except msgspec.DecodeError:
        return d.arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("command"), str) and len(parsed) == 1:
        return str(parsed["command"])  # a shell-like call: the command line itself
    return d.arguments


def call_cells(spec: WorkflowSpec | None, branch: BranchState, step: StepView, a: AttemptView) -> tuple[str, str]:
    """``(command, exit code)`` of a tool row (see the module doc); ``("", "")`` for other rows."""
    if step.kind != "tool":
        return "", ""
    is_command, argv = _is_command_tool(spec, step)
    if isinstance(step.parent_step, str):
        command = _arguments_text(branch, step)
        if is_command and argv:
            command = f"{shlex.join(argv)} <<< {command}" if command else shlex.join(argv)
    elif spec is not None:
        decl = _plain_tool(spec, step.step_id)
        command = shlex.join(argv) if argv else (decl.tool.input if decl is not None else "")
    else:
        command = ""
    return command, exit_code_cell(is_command, a)


def _plain_tool(spec: WorkflowSpec, step_id: str) -> ToolStep | None:
    try:
        decl = spec.step(step_id)
    except (KeyError, ValueError):
        return None
    return decl if isinstance(decl, ToolStep) else None


def exit_code_cell(is_command: bool, a: AttemptView) -> str:
    """A tool attempt's exit code: ``N`` from an ``exit_N`` kind, or (a command tool) from "exited N" or ``0`` on
    success; ``""`` otherwise."""
    if a.error_kind and a.error_kind.startswith("exit_") and a.error_kind[5:].lstrip("-").isdigit():
        return a.error_kind[5:]
    found = _EXITED.search(a.error_message or "") if a.status == "failed" else None
    if found and is_command:
        return found.group(1)
    if is_command and a.status == "succeeded":
        return "0"
    return ""


def fmt_ms(ms: float) -> str:
    """A latency (ms) with precision to match: ``0.017``, ``12.5``, ``850``."""
    return f"{ms:.3f}" if ms < 1 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def latency_cell(a: AttemptView, s: AttemptState | None) -> tuple[str, str]:
    """``(call ms, wall ms)``: the call's own latency (:func:`fmt_ms`), and intent → outcome (ms)."""
    own = "" if a.status == "dispatched" else fmt_ms(a.usage.latency_ms)
    wall = str(s.finished_ms - s.dispatched_ms) if s is not None and s.finished_ms is not None else ""
    return own, wall


def packed_tokens_cell(c: ContextPartition | None) -> str:
    """The packed token total recorded at pack time (``""`` for partitions recorded before it was)."""
    return str(c.packed_tokens) if c is not None and isinstance(c.packed_tokens, int) else ""


def drop_summary(c: ContextPartition) -> str:
    """``m0001 (excluded_kind), m0007 m0009 (duplicate)``: dropped ids grouped by reason, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for item, reason in c.dropped_with_reasons():
        groups.setdefault(reason or "reason not recorded", []).append(item)
    return ", ".join(f"{' '.join(ids)} ({reason})" for reason, ids in groups.items())
