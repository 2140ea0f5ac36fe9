"""Human-readable renderings of runs for the CLI: timelines, event lines, verdicts (rich)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import msgspec
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from reel.services.timeline import rows
from reel.services.timeline.table import AttemptTable
from reel.shared.core.input import requestfold
from reel.shared.core.input.requeststate import InputRecord
from reel.shared.core.run import budget, codeids, timers
from reel.shared.core.run.events import (
    AgentFinished,
    AnyEvent,
    AttemptCancelled,
    AttemptDispatched,
    AttemptFailed,
    AttemptSucceeded,
    BlobRef,
    BranchForked,
    InputAnswered,
    InputRequested,
    RunAwaitingInput,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunSleeping,
    RunStarted,
    RunVerifying,
    RunWoke,
    StepHalted,
    StepsDeclared,
    Verdict,
    VerdictRecorded,
)
from reel.shared.core.run.ids import AttemptNo, BranchId, StepId
from reel.shared.core.run.state import BranchState, RunState
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView, build_episode_view
from reel.shared.core.verify.verification import checks_summary, reported_outcome
from reel.shared.core.workflow.spec import WorkflowSpec

STATUS_STYLE = {"succeeded": "green", "failed": "red", "dispatched": "yellow", "pass": "green", "fail": "red",
                "error": "magenta", "passed": "green", "completed": "green", "cancelled": "red",
                "verifying": "cyan", "running": "yellow", "pending": "dim", "awaiting_input": "magenta",
                "sleeping": "blue"}


def clip(text: str, n: int = 80) -> str:
    """``text`` in at most about ``n`` characters, never cut mid-word: at the last space before ``n``, then ``…``
    (``reel show`` prints whole messages; progress lines clip)."""
    if len(text) <= n:
        return text
    cut = text.rfind(" ", 0, n)
    return text[:cut if cut > n // 2 else n].rstrip() + "…"


def event_line(lsn: int, event: AnyEvent) -> Text:
    """One line describing one event, for ``reel run`` progress."""
    t = Text(f"  lsn {lsn:>6}  ", style="dim")
    match event:
        case RunCreated():
            t.append(f"run created: {event.workflow_name} ({len(event.steps)} steps)")
        case RunStarted():
            t.append(f"claimed by executor {event.executor_id}")
        case AttemptDispatched():
            t.append(f"{event.step_id}#{event.attempt} dispatched", style="yellow")
            if event.context is not None:
                c = event.context
                t.append(f"  context packed={len(c.packed)} available={len(c.available)} dropped={len(c.dropped)}"
                         + (f" trimmed={len(c.trimmed)}" if isinstance(c.trimmed, tuple) and c.trimmed else ""))
        case AttemptSucceeded():
            t.append(f"{event.step_id}#{event.attempt} succeeded", style="green")
            u = event.usage
            if isinstance(u.source, msgspec.UnsetType) and not (u.input_tokens or u.output_tokens):
                t.append(f"  {u.latency_ms:.1f} ms")  # a tool attempt: no tokens to show
            else:
                source = "" if isinstance(u.source, msgspec.UnsetType) else f" ({u.source})"
                t.append(f"  {u.input_tokens}→{u.output_tokens} tok{source}, {u.latency_ms:.1f} ms")
            if isinstance(event.finish_reason, str) and event.finish_reason not in ("stop", "tool_calls"):
                t.append(f"  finish_reason {event.finish_reason}", style="magenta")
            if event.recovered:
                t.append("  (recovered)", style="magenta")
            if event.truncated is True:
                t.append(f"  (output truncated: {event.output_ref.size_bytes} B stored)", style="magenta")
        case AttemptFailed():
            t.append(f"{event.step_id}#{event.attempt} failed: {event.error_kind}: {clip(event.message)}", style="red")
            if event.usage.source == "none":
                t.append("  (no usage: 0 tok)", style="dim")
        case AttemptCancelled():
            t.append(f"{event.step_id}#{event.attempt} cancelled", style="red")
            t.append(f"  stopped after {event.usage.latency_ms:.1f} ms" + ("  (recovered)" * event.recovered))
        case RunVerifying():
            t.append(f"verifying branch {event.branch_id}", style="cyan")
        case VerdictRecorded():
            v = event.verdict
            t.append(f"verdict {v.verifier}: {v.status} ({v.score:.2f}) {clip(v.reason)}",
                     style=STATUS_STYLE.get(v.status, ""))
        case RunCompleted():
            t.append(f"completed: {event.outcome}", style=STATUS_STYLE.get(event.outcome, "bold"))
        case RunCancelled():
            t.append("cancelled" + _by(event.by) + (f": {event.reason}" if event.reason else ""), style="red")
        case StepsDeclared():
            _declared(t, event)
        case AgentFinished():
            t.append(f"agent {event.step_id} {event.status} after {event.turns} turn{'s' * (event.turns != 1)}",
                     style=STATUS_STYLE.get(event.status, ""))
            if event.error_kind:
                t.append(f": {event.error_kind}: {clip(event.message)}", style="red")
        case InputRequested() | InputAnswered() | RunAwaitingInput():
            _input(t, event)
        case StepHalted():
            t.append(f"halted before {event.step_id}: {event.reason}: {clip(event.message, 160)}", style="red")


        case RunSleeping():
            t.append(f"sleeping until {utc(event.wake_ms)} ({(event.wake_ms - event.at_ms) / 1000:g} s; "
                     f"{event.step_id}{': asked to be resumed' if event.reason == 'resume_after' else ''})",
                     style="blue")
        case RunWoke():
            t.append(f"woke ({event.step_id})", style="blue")
        case BranchForked():
            t.append(f"branch {event.branch_id} forked from {event.parent_branch_id} at lsn {event.fork_lsn}"
                     + (f" (step {event.from_step})" if event.from_step else "") + _by(event.by), style="cyan")
    return t


def _by(by: str | msgspec.UnsetType) -> str:
    """`` by NAME`` for a command's recorded sender, ``""`` when none was named."""
    return f" by {by}" if isinstance(by, str) and by else ""
def utc(ms: int) -> str:
    """Epoch ms as an ISO-8601 UTC time to the millisecond (``2026-12-02T08:00:00.000Z``)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _declared(t: Text, event: StepsDeclared) -> None:
    """A turn declared, or one line per tool call a turn asked for (tool, call id, arguments)."""
    for i, d in enumerate(event.steps):
        if i:
            t.append("\n" + " " * 14)  # under the first line's text
        if d.kind == "turn":
            t.append(f"turn {d.turn} of {event.parent_step}: {d.step_id}", style="bold")
            continue
        args = d.arguments if d.arguments is not None else f"<{d.arguments_ref.size_bytes if d.arguments_ref else 0} B>"
        t.append(f"{d.step_id} tool call ", style="bold")
        t.append(f"{d.tool_name}({args[:80]}{'…' if len(args) > 80 else ''})", style="cyan")
        t.append(f"  id {d.call_id}", style="dim")


def _input(t: Text, event: InputRequested | InputAnswered | RunAwaitingInput) -> None:
    """A request (who is asked what, its id, its deadline), an answer, or the run resting until one."""
    if isinstance(event, RunAwaitingInput):
        t.append(f"awaiting input on branch {event.branch_id}", style="magenta")
    elif isinstance(event, InputRequested):
        what = f"needs approval ({event.tool_name})" if event.kind == "approval" else \
            f"{'asks' if event.kind == 'question' else event.tool_name + ' asks'}: {clip(event.question)}"
        t.append(f"{event.step_id} {what}", style="magenta")
        t.append(f"  request {event.request_id}" + (f", asked: {event.asked}" if event.asked else ""), style="dim")
        if event.deadline_ms is not None:
            t.append(f", deadline in {(event.deadline_ms - event.at_ms) / 1000:g} s → {event.default}", style="dim")
    else:
        said = {"approve": "approved", "reject": "rejected", "answer": "answered"}[event.decision]
        t.append(f"{event.step_id} {said}" + (f" by {event.by}" if event.by else "")
                 + (" (deadline default)" if event.source == "deadline" else ""), style="magenta")
        detail = event.arguments if event.arguments is not None else (event.note or event.text)
        if detail:
            t.append(f": {clip(detail)}" + (" (edited arguments)" if event.arguments is not None else ""), style="dim")


def verdict_table(verdicts: list[Verdict] | tuple[Verdict, ...]) -> Table:
    """Verdicts as a table: verifier, status, score, branch, snapshot LSN, reason."""
    table = Table(title="verdicts", title_justify="left")
    for col in ("verifier", "status", "score", "branch", "lsn"):
        table.add_column(col, no_wrap=True)
    table.add_column("reason", overflow="fold")
    for v in verdicts:
        table.add_row(f"{v.verifier}@{v.verifier_version}", Text(v.status, style=STATUS_STYLE.get(v.status, "")),
                      f"{v.score:.2f}", v.branch_id, str(v.snapshot_lsn), v.reason)
    return table


def timeline(state: RunState, branch_id: str | None = None, spec: WorkflowSpec | None = None) -> Group:
    """``reel show``: header, branches, one row per attempt, the notes printed whole, verdicts.

    Each row: status; for a tool call its command (or arguments), exit code and output size
    (bytes); for a model attempt its partition sizes (packed / available / dropped), the
    packed tokens (counted at pack time) beside the recorded input / output tokens; the
    call's own latency / the wall time from intent to outcome (ms); LSNs; the error (one
    too long for its cell points to a note below the table). Below the table, in full
    (never cut): those notes, then each model attempt's dropped ids with their reasons.
    ``spec`` (the run's workflow) adds what only it knows: a plain tool step's command,
    which tools run commands (their exit codes).
    """
    bid = BranchId(branch_id) if branch_id else state.active_branch
    view = build_episode_view(state, bid)
    branch = state.branches[bid]
    table = AttemptTable(f"branch {bid}")  # fitted to the width it is printed at
    notes: list[Text] = []  # messages too long for the table's last cell, whole, below it
    drops: list[Text] = []  # each model attempt's dropped ids with their reasons, below the notes
    changed = codeids.changes(branch)  # attempts whose code differs from their tool's earlier attempts
    for step in view.steps:
        name, kind = _labels(step)
        if not step.attempts:
            table.add_row(*_plain((name, kind, "-", Text(step.status, style="dim"), *[""] * 9,
                                   _cell(_answer(step), step.step_id, notes))))
        for a in step.attempts:
            table.add_row(*_plain(_row(spec, branch, step, name, kind, a, notes, changed)))
            _dropped_note(drops, a)
    u = view.usage
    footer = Text(f"usage: {rows.tokens_by_source(view)}, "
                  f"{rows.fmt_ms(u.latency_ms)} ms, ${u.cost_usd:.4f}; failed attempts: {view.failed_attempts}")
    parts: list[Text | Table | AttemptTable] = [_header(state), *_budget_lines(state, branch), _branches(state, bid),
                                                table, *notes, *drops, footer, *_agent_lines(view)]
    if state.verdicts:
        parts.append(verdict_table(state.verdicts))
    return Group(*parts)


def _header(state: RunState) -> Text:
    """Run, workflow, status, the reported outcome (:mod:`reel.shared.core.verify.verification`) and context checks,
    head, commits."""
    header = Text()
    header.append(f"run {state.run_id}", style="bold")
    header.append(f"  workflow {state.workflow_name}  status ")
    header.append(state.status, style=STATUS_STYLE.get(state.status, ""))
    outcome = reported_outcome(state)
    if outcome:
        header.append(f"  outcome {outcome}", style=STATUS_STYLE.get(outcome, ""))
    if checks := checks_summary(state):
        header.append(f"  context check {checks}", style="dim")
    if (timer := timers.sleeping_timer(state.status, state.active)) is not None:
        header.append(f"  wakes {utc(timer.wake_ms)} ({timer.step_id})", style="blue")
    header.append(f"  head lsn {state.head_lsn}  commits {state.commits}")
    return header


def _budget_lines(state: RunState, branch: BranchState) -> list[Text]:
    """The run's spend against its budget (none: no line), and the halt that ended the branch shown, if any: its
    end reason (``budget_exhausted``, ``code_changed``) and message, whole."""
    out = []
    if budget.budget_of(state.budget) is not None and (line := budget.summary(state, int(time.time() * 1000))):
        out.append(Text(f"budget: {line}", style="dim"))
    if isinstance(branch.halt, StepHalted):
        out.append(Text(f"end reason {branch.halt.reason} (before {branch.halt.step_id}): {branch.halt.message}",
                        style="red"))
    return out


def _branches(state: RunState, bid: BranchId) -> Text:
    return Text("branches: " + "   ".join(
        ("* " if b.branch_id == state.active_branch else "") + b.branch_id
        + (f" ← {b.parent_branch_id}@{b.fork_lsn}" if b.parent_branch_id else "")
        + (" (shown)" if b.branch_id == bid else "")
        for b in state.branches.values()))


def _plain(cells: tuple[str | Text, ...]) -> tuple[Text, ...]:
    """Cells as text, never Rich markup: a tool argument such as ``list[str]`` prints as written."""
    return tuple(Text(c) if isinstance(c, str) else c for c in cells)


def _row(spec: WorkflowSpec | None, branch: BranchState, step: StepView, name: str, kind: str,
         a: AttemptView, notes: list[Text], changed: dict[tuple[StepId, AttemptNo], codeids.CodeChange] | None = None,
         ) -> tuple[str | Text, ...]:
    c = a.context
    status = a.status + (" (superseded)" if a.superseded else "") + (" (recovered)" if a.recovered else "")
    change = (changed or {}).get((a.step_id, a.attempt))
    if change is not None:
        status += " (code changed)"
        notes.append(Text(f"{step.step_id}#{a.attempt}: {change.message}", style="magenta"))
    if a.truncated is True and a.output_ref:
        status += " (truncated)"
        if isinstance(a.finish_reason, str):  # a model's answer cut by the server, taken (on_truncated: continue)
            notes.append(Text(f"{step.step_id}#{a.attempt}: the model's answer was cut (finish_reason "
                              f"{a.finish_reason}); on_truncated: continue took it as it is", style="magenta"))
        else:
            parsed = parse_step_id(step.step_id)
            if parsed is not None and parsed[2] >= 0:  # an agent's tool call: its result holds the note the model read
                notes.append(Text(f"{step.step_id}#{a.attempt}: output truncated at the tool's max_output_bytes "
                                  f"({a.output_ref.size_bytes} B stored: the head and the note saying so)",
                                  style="magenta"))
            else:
                notes.append(Text(f"{step.step_id}#{a.attempt}: output truncated to its first "
                                  f"{a.output_ref.size_bytes} B (the tool's max_output_bytes)", style="magenta"))
    if isinstance(a.error_ref, BlobRef):
        notes.append(Text(f"{step.step_id}#{a.attempt}: the whole error body ({a.error_ref.size_bytes} B, "
                          f"{a.error_ref.media_type}) is blob {a.error_ref.sha256}", style="dim"))
    lsns = f"{a.dispatched_lsn}→{a.outcome_lsn}" if a.outcome_lsn else f"{a.dispatched_lsn}→"
    command, exit_code = rows.call_cells(spec, branch, step, a)
    own_ms, wall_ms = rows.latency_cell(a, rows.attempt_state(branch, a))
    return (
        name, kind, str(a.attempt), Text(status, style=STATUS_STYLE.get(a.status, "")), command, exit_code,
        str(a.output_ref.size_bytes) if a.output_ref else "",
        f"{len(c.packed)}/{len(c.available)}/{len(c.dropped)}" if c else "",
        rows.packed_tokens_cell(c), rows.tokens_cell(a), rows.finish_cell(a),
        f"{own_ms}/{wall_ms}" if own_ms or wall_ms else "", lsns,
        _cell(f"{a.error_kind}: {a.error_message}" if a.error_kind else "", f"{step.step_id}#{a.attempt}", notes),
    )


def _dropped_note(drops: list[Text], a: AttemptView) -> None:
    """A model attempt's dropped items with the reasons recorded at pack time, whole; the items whose text was
    cut to its head and tail before packing (docs/context.md); and the items a fork restored (docs/forks.md)."""
    if a.context is not None and a.context.dropped:
        drops.append(Text(f"  {a.step_id}#{a.attempt} dropped: {rows.drop_summary(a.context)}", style="dim"))
    if a.context is not None and isinstance(a.context.trimmed, tuple) and a.context.trimmed:
        drops.append(Text(f"  {a.step_id}#{a.attempt} trimmed (head and tail only): {' '.join(a.context.trimmed)}",
                          style="dim"))
    if a.context is not None and isinstance(a.context.restored, tuple):
        drops.append(Text(f"  {a.step_id}#{a.attempt} restored by fork: {' '.join(a.context.restored)}",
                          style="dim"))


CELL_CHARS = 60
"""The longest message shown in the timeline's last cell; a longer one is printed whole below the table."""


def _cell(message: str, where: str, notes: list[Text]) -> str:
    """``message`` for the last cell, or, if longer than :data:`CELL_CHARS`, a pointer to a note (appended to
    ``notes``: ``[n] where: message``, the message whole) — never a message cut mid-word."""
    if len(message) <= CELL_CHARS:
        return message
    notes.append(Text(f"[{len(notes) + 1}] {where}: {message}"))
    return f"{message.split(':', 1)[0]}: see [{len(notes)}] below"


def _answer(step: StepView) -> str:
    """A call a human answered without it running: the rejection's note or the answer."""
    r = step.input.response if isinstance(step.input, InputRecord) else None
    if r is None or r.decision == "approve":
        return ""
    return f"{'rejected' if r.decision == 'reject' else 'answered'}: {r.note or r.text}"


def _labels(step: StepView) -> tuple[str, str]:
    """The step and kind cells: a turn is ``turn``, a tool call shows its tool and the call id the model saw."""
    if step.kind == "tool" and isinstance(step.tool_name, str):
        return f"{step.step_id} ({step.call_id})", f"tool {step.tool_name}"
    if step.kind == "model" and isinstance(step.turn, int):
        return step.step_id, "turn"
    return step.step_id, step.kind


def _agent_lines(view: EpisodeView) -> list[Text]:
    """One summary line per agent step: its status, turns, tool calls and error observations."""
    out = []
    for agent in (s for s in view.steps if s.kind == "agent"):
        mine = [s for s in view.steps if s.parent_step == agent.step_id]
        turns = sum(1 for s in mine if s.kind == "model")
        calls = [s for s in mine if s.kind == "tool"]
        errors = sum(1 for s in calls if s.is_error is True)
        line = Text(f"agent {agent.step_id}: ")
        line.append(agent.status, style=STATUS_STYLE.get(agent.status, ""))
        if agent.status == "running" and view.status in ("awaiting_input", "sleeping"):
            line.append(f" ({str(view.status).replace('_', ' ')})")  # the run waits on it: no turn is in flight
        line.append(f", {turns} turn{'s' * (turns != 1)}, {len(calls)} tool call{'s' * (len(calls) != 1)} "
                    f"({errors} error observation{'s' * (errors != 1)})"
                    + (f", {agent.error_kind}" if isinstance(agent.error_kind, str) else ""))
        out.append(line)
    return out


def open_requests(state: RunState) -> list[dict[str, Any]]:
    """The open input requests of a live run's active branch, one JSON-ready object each (``run_id``,
    ``request_id``, the call, who is asked, the deadline)."""
    out = []
    for r, decl in requestfold.open_calls(state):
        args = decl.arguments if decl is not None and decl.arguments is not None else None
        out.append({"run_id": state.run_id, "request_id": r.request_id, "run_status": str(state.status),
                    "step_id": r.step_id, "kind": r.kind, "tool": r.tool_name, "call_id": r.call_id,
                    "arguments": args, "question": r.question, "asked": r.asked, "deadline_ms": r.deadline_ms,
                    "default": r.default})
    return out


def how_to_answer(rec: InputRecord | dict[str, Any], run_id: str) -> str:
    """The commands that answer one request."""
    rid, kind = (rec.request_id, rec.kind) if isinstance(rec, InputRecord) else (rec["request_id"], rec["kind"])
    if kind != "approval":
        return f"reel answer {run_id} {rid} 'TEXT'   |   reel reject {run_id} {rid} --note 'WHY'"
    return f"reel approve {run_id} {rid} [--args JSON]   |   reel reject {run_id} {rid} --note 'WHY'"


def print_waiting(console: Console, state: RunState) -> None:
    """What a run waiting for input asks, and how to answer each request (``reel run`` prints it)."""
    console.print(Text(f"run {state.run_id} is awaiting input:", style="bold magenta"))
    for r in open_requests(state):
        what = f"asks: {r['question']}" if r["kind"] != "approval" else f"{r['tool']}({r['arguments'] or ''})"
        console.print(f"  {r['request_id']}  {r['step_id']} {what}" + (f"  [asked: {r['asked']}]" if r["asked"]
                                                                         else ""), markup=False, highlight=False)
        console.print(f"      {how_to_answer(r, state.run_id)}", markup=False, highlight=False)


def print_timeline(console: Console, state: RunState, branch_id: str | None = None,
                   spec: WorkflowSpec | None = None) -> None:
    """Print :func:`timeline` of ``state`` (``branch_id``: default the active branch; ``spec``: the run's
    workflow, when the caller has it) on ``console``.

    Raises:
        KeyError: ``state`` has no branch ``branch_id``.
    """
    console.print(timeline(state, branch_id, spec))
