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
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView
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
    """The packed token total recorded at pack time (``""`` for partitions recorded before it was), with the
    tokens reserved outside the items after a ``+`` when there are any (``118+380``: an agent turn's tool schemas;
    in logs recorded before a model step was an agent's first turn, its instructions)."""
    if c is None or not isinstance(c.packed_tokens, int):
        return ""
    reserved = c.reserved_tokens if isinstance(c.reserved_tokens, int) else 0
    return f"{c.packed_tokens}+{reserved}" if reserved else str(c.packed_tokens)


def drop_summary(c: ContextPartition) -> str:
    """``m0001 (excluded_kind), m0007 m0009 (duplicate)``: dropped ids grouped by reason, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for item, reason in c.dropped_with_reasons():
        groups.setdefault(reason or "reason not recorded", []).append(item)
    return ", ".join(f"{' '.join(ids)} ({reason})" for reason, ids in groups.items())


def tokens_cell(a: AttemptView) -> str:
    """``in/out`` tokens, and for a model attempt where they come from: ``12/7 reported``, ``204/31 estimated``,
    ``0/0 none`` (a call that reached no server or got an error: nothing counted); no label when the usage
    says no source (a tool attempt, a log recorded before sources were)."""
    u = a.usage
    source = "" if isinstance(u.source, msgspec.UnsetType) else f" {u.source}"
    return f"{u.input_tokens}/{u.output_tokens}{source}"


def finish_cell(a: AttemptView) -> str:
    """A model attempt's finish reason as the server sent it (``-`` when it sent none; ``""`` when none is
    recorded: a tool attempt, an attempt without an answer, a log recorded before finish reasons were)."""
    if isinstance(a.finish_reason, msgspec.UnsetType):
        return ""
    return "-" if a.finish_reason is None else a.finish_reason


def tokens_by_source(view: EpisodeView) -> str:
    """The totals line's tokens, never an estimate mixed into what a server reported: ``984 in (reported) +
    204 in (estimated), 120 out (reported) + 31 out (estimated)``; a log without usage sources reads
    ``984 input tokens, 120 output tokens`` as before."""
    split = view.usage_by_source
    if isinstance(split, msgspec.UnsetType):
        return f"{view.usage.input_tokens} input tokens, {view.usage.output_tokens} output tokens"
    counted = {k: u for k, u in split.items() if k != "none"} or split
    ins = " + ".join(f"{u.input_tokens} in ({k})" for k, u in counted.items())
    outs = " + ".join(f"{u.output_tokens} out ({k})" for k, u in counted.items())
    none = split.get("none")
    failed = f", {sum(1 for a in view.attempts() if a.usage.source == 'none')} attempt(s) with no usage (none)" \
        if none is not None and counted is not split else ""
    return f"{ins}, {outs}{failed}"
