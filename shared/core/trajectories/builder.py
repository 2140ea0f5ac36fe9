"""A format-neutral :class:`~reel.shared.core.trajectories.recording.Recording` → a validated agent-step workflow.

Replay is the agent loop: a recording becomes one ``kind: agent`` step,
:data:`AGENT_STEP` (``replay``), whose model is the ``replay`` adapter playing the
recorded assistant messages as ``turns`` (text, tool calls and usage as recorded) and
whose tools are ``recorded`` tools answering each call with the recorded observation
(``by_call_id``). The executor runs it like a live agent: turn *t* is step
``replay:t<t>``, its calls ``replay:t<t>:c<i>``; each turn's context is packed from the
instructions, the task and the earlier turns (:mod:`reel.shared.core.agent.turncontext`).

* The system message before the first turn → the step's ``instructions``; the other
  messages before it (the task, SWE-agent demos, an OpenHands recall) → ``context``
  items with their recorded ids (``m0001``) and :data:`PRIORITY`.
* Each turn's calls get the recorded provider id, or — when the recording has none
  (a shell action, a reply to the user) or repeats an earlier one — the id Reel
  assigns a live model's call (``call_t<turn>_<i>``, :func:`reel.shared.core.chat.messages.assign_call_ids`).
* Text that answers no call (an uncaused observation, a message between turns) is
  appended to the turn's latest result; a turn that made no call but was answered,
  or is followed by another turn, gets one ``respond`` call (arguments ``{}``) whose
  result is that answer (``""`` when none) — so only the last turn ends the loop. A
  call the recording never answered (OpenHands ``finish``) returns ``""``.
* When the last recorded turn called tools, one closing turn :data:`CLOSING_TEXT`
  (usage 0 tokens) ends the loop after their results: the agent step's output.

Verifiers: ``recorded_outcome`` when the recording has a label (the outcome verifier), and
``task-in-final-context`` (``context_requires`` the task item at the last recorded turn): a
*context check*, named in the workflow's ``context_checks`` label, reported beside the outcome and
never as it — a recording without a label reports outcome ``unlabelled``
(:mod:`reel.shared.core.verify.verification`).
"""

from __future__ import annotations

import re

import msgspec

from reel.shared.core.chat.messages import ToolCall, assign_call_ids
from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.run.stepids import turn_step_id
from reel.shared.core.trajectories.recording import Call, Entry, Lit, Obs, Recording, Turn
from reel.shared.core.verify.verification import CONTEXT_CHECKS_LABEL
from reel.shared.core.workflow.agentspec import TOOL_NAME, AgentToolSpec, RecordedToolSpec
from reel.shared.core.workflow.spec import (
    AgentStep,
    ContextItemSpec,
    ModelSpec,
    PolicySpec,
    RecordedUsage,
    ScriptedToolCall,
    ScriptedTurn,
    VerifierSpec,
    WorkflowSpec,
    encode_workflow,
    validate_workflow,
)

AGENT_STEP = "replay"
"""Step id of a replayed recording's agent step."""
CLOSING_TEXT = "[end of recording]"
"""Text of the closing turn (and of an empty last turn): the replayed agent step's output then."""
RESPOND = "respond"
"""The call a turn without calls gets when the recording answered it (tau-bench's name for replying to the user)."""

MAX_WORKFLOW_BYTES = 8 * 1024 * 1024
"""Largest encoded workflow the loader returns (bytes); larger raises TrajectoryFormatError."""

PRIORITY = {"system": 3.0, "task": 2.0, "demo": 1.0}
"""Packing priority per context kind; every other kind is 0 (ties go to the more recent item)."""

EXCLUDED_KINDS = ("demo",)
"""Kinds the loader's policy drops outright (SWE-agent in-context demonstrations)."""

_NOT_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
CONTEXT_CHECK_TYPES = ("context_requires",)
"""Verifier types that check Reel's packing, not the recorded agent: context checks, never the run's outcome
(the workflow's ``context_checks`` label names them; :mod:`reel.shared.core.verify.verification`)."""


def checks_label(verifiers: tuple[VerifierSpec, ...]) -> str:
    """The ``context_checks`` label: the names of the context-check verifiers, comma-separated."""
    return ",".join(v.label for v in verifiers if v.type in CONTEXT_CHECK_TYPES)


def policy(entries: list[Entry], budget_tokens: int, counter: TokenCounter) -> PolicySpec:
    """Exclude demos, dedupe, cap items at a quarter of the budget (never below the system/task items; tokens)."""
    instr = max((counter.count(e.text) for e in entries if isinstance(e, Lit) and e.kind in ("system", "task")),
                default=0)
    cap = min(budget_tokens, max(budget_tokens // 4, instr))
    return PolicySpec(exclude_kinds=EXCLUDED_KINDS, max_item_tokens=cap, dedupe=True)


def checked(rec: Recording, spec: WorkflowSpec) -> WorkflowSpec:
    """``spec`` (the replay workflow of ``rec``) validated, and no larger than :data:`MAX_WORKFLOW_BYTES` encoded.

    Raises:
        WorkflowInvalid: ``spec`` fails validation (:func:`reel.shared.core.workflow.spec.validate_workflow`).
        TrajectoryFormatError: it encodes to more than :data:`MAX_WORKFLOW_BYTES` bytes.
    """
    spec = validate_workflow(spec)
    size = len(encode_workflow(spec))
    if size > MAX_WORKFLOW_BYTES:
        raise TrajectoryFormatError(f"{rec.where}: workflow {rec.name} would be {size} bytes "
                                    f"(> {MAX_WORKFLOW_BYTES}); the recording is too large to replay as one run")
    return spec


class _Turn(msgspec.Struct):
    """A recorded turn being assembled: its calls and the result of each (``None``: not answered yet)."""

    turn: Turn
    calls: list[Call]
    results: list[str | None]

    def answer(self, text: str, name: str, index: int | None = None) -> None:
        """Record ``text`` as the result of call ``index``, else of the first open call, else of the
        latest one (appended), else of a new call ``name``."""
        if index is None or not 0 <= index < len(self.calls):
            index = next((i for i, r in enumerate(self.results) if r is None), None)
        if index is None and self.results:
            index = len(self.results) - 1
        if index is None:
            self.calls.append(Call("", name, "{}"))
            self.results.append(text)
            return
        done = self.results[index]
        self.results[index] = text if done is None else (f"{done}\n\n{text}" if done else text)


def _split(entries: list[Entry]) -> tuple[str, list[ContextItemSpec], list[_Turn]]:
    """Instructions, the static context items (before the first turn) and the turns with their results."""
    instructions: str | None = None
    context: list[ContextItemSpec] = []
    turns: list[_Turn] = []
    for e in entries:
        if isinstance(e, Turn):
            turns.append(_Turn(turn=e, calls=list(e.calls), results=[None] * len(e.calls)))
        elif turns:
            turns[-1].answer(e.output if isinstance(e, Obs) else e.text, e.name if isinstance(e, Obs) else RESPOND,
                             e.call if isinstance(e, Obs) else None)
        elif isinstance(e, Lit) and e.kind == "system" and instructions is None:
            instructions = e.text
        else:
            text = e.output if isinstance(e, Obs) else e.text
            context.append(ContextItemSpec(id=e.id, text=text, kind=e.kind, priority=PRIORITY.get(e.kind, 0.0)))
    for t in turns[:-1]:
        if not t.calls:  # answered (or followed by another turn): the loop must go on
            t.answer("", RESPOND)
    return instructions or "", context, turns


def _tool_name(name: str) -> str:
    """``name`` as a chat-completions function name (``[A-Za-z0-9_-]{1,64}``)."""
    if TOOL_NAME.match(name):
        return name
    return _NOT_TOOL_NAME.sub("_", name)[:64] or "tool"


def _replayed(turns: list[_Turn]) -> tuple[list[ScriptedTurn], dict[str, dict[str, str]]]:
    """The replay adapter's turns (ids final) and each tool's recorded result per call id."""
    taken: set[str] = set()
    tools: dict[str, dict[str, str]] = {}
    out: list[ScriptedTurn] = []
    for k, t in enumerate(turns, 1):
        calls = assign_call_ids([ToolCall(id=c.id, name=_tool_name(c.name), arguments=c.arguments)
                                 for c in t.calls], turn=k, taken=taken)
        taken.update(c.id for c in calls)
        for c, result in zip(calls, t.results, strict=True):
            tools.setdefault(c.name, {})[c.id] = result or ""
        text = t.turn.content if t.turn.content or calls else CLOSING_TEXT
        out.append(ScriptedTurn(text=text, usage=t.turn.usage, tool_calls=tuple(
            ScriptedToolCall(name=c.name, arguments=c.arguments, id=c.id) for c in calls)))
    if out[-1].tool_calls:
        out.append(ScriptedTurn(text=CLOSING_TEXT, usage=RecordedUsage(input_tokens=0, output_tokens=0)))
    return out, tools


def build(rec: Recording, budget_tokens: int, counter: TokenCounter) -> WorkflowSpec:
    """The replay workflow of one recording: one agent step, every turn packed under ``budget_tokens`` (tokens).

    Raises:
        TrajectoryFormatError: the recording has no model turn, or its workflow encodes
            to more than :data:`MAX_WORKFLOW_BYTES`.
    """
    instructions, context, recorded = _split(rec.entries)
    if not recorded:
        raise TrajectoryFormatError(f"{rec.where}: no recorded model turns (no assistant message)")
    task = next((c.id for c in context if c.kind == "task"), None)
    if task is None:  # an agent step leads every turn with a task
        context.append(ContextItemSpec(id="task", text="", kind="task", priority=PRIORITY["task"]))
    turns, results = _replayed(recorded)
    tools = tuple(AgentToolSpec(name=name, description=f"replays the recorded results of `{name}`", retry_safe=True,
                                recorded=RecordedToolSpec(by_call_id=by_id)) for name, by_id in results.items())
    model = ModelSpec(adapter="replay", name=rec.model, turns=tuple(turns))
    agent = AgentStep(id=AGENT_STEP, model=model, instructions=instructions, context=tuple(context),
                      policy=policy(rec.entries, budget_tokens, counter), tools=tools, max_turns=len(turns))
    verifiers: tuple[VerifierSpec, ...] = ()
    if rec.outcome is not None:
        verifiers += (VerifierSpec(type="recorded_outcome", name="recorded_outcome", expect=rec.outcome),)
    if task is not None:  # did the agent still have the task in view when it decided its last action?
        verifiers += (VerifierSpec(type="context_requires", name="task-in-final-context",
                                   step=turn_step_id(AGENT_STEP, len(recorded)), item=task),)
    src = rec.source
    n_calls = sum(len(t.tool_calls) for t in turns)
    desc = (f"Replay of {src['agent']}{' / ' + rec.model if rec.model else ''} on {src['instance_id']}: "
            f"{len(recorded)} model turns, {n_calls} tool calls"
            + ("" if rec.outcome is None else f", recorded outcome {rec.outcome}"))
    return checked(rec, WorkflowSpec(
        name=rec.name, description=desc, budget_tokens=budget_tokens, steps=(agent,), verifiers=verifiers,
        labels={"format": str(src["format"]), CONTEXT_CHECKS_LABEL: checks_label(verifiers)},
        source={**src, "closing_turn": len(turns) > len(recorded)},
    ))
