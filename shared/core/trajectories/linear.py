"""A :class:`~reel.shared.core.trajectories.recording.Recording` → its **linear** workflow: one model step per turn.

The form ``reel replay`` used before replay became an agent step (:mod:`.builder`), kept
for analyses that pack each turn's context the way a ``kind: model`` step does — the
crucible worked example's judge (``examples/crucible/judge.py``) scores its policy over it.
``load_trajectories(path, form="linear")`` returns it.

* each recorded model turn → a model step ``tNN-model`` with the ``replay``
  adapter, ``output`` = the recorded text (tool calls rendered as ``<tool_call>`` lines)
  and the recorded usage where there is one;
* each environment answer to that turn → a ``recorded`` tool step ``tNN-tool``
  (``tNN-tool-2``, … when a turn has several);
* the candidate context of turn N = every earlier entry, in order: literal
  ``text`` for what no step produced and ``from_step`` references for earlier
  model outputs (kind ``output``) and tool results (kind ``observation``, or
  ``message`` for a simulated user). A workflow therefore grows O(n) with the turns, not O(n²).

Verifiers: ``recorded_outcome`` when the recording has a label, and
``task-in-final-context`` (``context_requires`` the task item at the last model step), a context check
(the ``context_checks`` label, :mod:`reel.shared.core.verify.verification`).
"""

from __future__ import annotations

from reel.shared.core.errors import TrajectoryFormatError
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.trajectories.builder import PRIORITY, checked, checks_label, policy
from reel.shared.core.trajectories.recording import Obs, Recording, Turn
from reel.shared.core.verify.verification import CONTEXT_CHECKS_LABEL
from reel.shared.core.workflow.spec import (
    ContextItemSpec,
    ModelSpec,
    ModelStep,
    Step,
    ToolSpec,
    ToolStep,
    VerifierSpec,
    WorkflowSpec,
)


def build_linear(rec: Recording, budget_tokens: int, counter: TokenCounter) -> WorkflowSpec:
    """The linear replay workflow of one recording, every model step under ``budget_tokens`` (tokens).

    Raises:
        TrajectoryFormatError: the recording has no model turn, or its workflow
            encodes to more than :data:`.builder.MAX_WORKFLOW_BYTES`.
    """
    turns = sum(isinstance(e, Turn) for e in rec.entries)
    if turns == 0:
        raise TrajectoryFormatError(f"{rec.where}: no recorded model turns (no assistant message)")
    width = max(2, len(str(turns)))
    pol = policy(rec.entries, budget_tokens, counter)
    steps: list[Step] = []
    history: list[ContextItemSpec] = []
    n = tools = 0
    for e in rec.entries:
        if isinstance(e, Turn):
            n, tools = n + 1, 0
            sid = f"t{n:0{width}d}-model"
            model = ModelSpec(adapter="replay", output=e.output, usage=e.usage, name=rec.model)
            steps.append(ModelStep(id=sid, model=model, context=tuple(history), policy=pol))
            history.append(ContextItemSpec(id=e.id, from_step=sid, kind="output"))
        elif isinstance(e, Obs) and n > 0:
            tools += 1
            sid = f"t{n:0{width}d}-tool" + (f"-{tools}" if tools > 1 else "")
            steps.append(ToolStep(id=sid, tool=ToolSpec(type="recorded", name=e.name, input=e.input, output=e.output)))
            history.append(ContextItemSpec(id=e.id, from_step=sid, kind=e.kind))
        else:
            kind = e.kind
            history.append(ContextItemSpec(id=e.id, text=e.output if isinstance(e, Obs) else e.text, kind=kind,
                                           priority=PRIORITY.get(kind, 0.0)))
    verifiers: tuple[VerifierSpec, ...] = ()
    if rec.outcome is not None:
        verifiers += (VerifierSpec(type="recorded_outcome", name="recorded_outcome", expect=rec.outcome),)
    task = next((h.id for h in history if h.kind == "task"), None)
    if task is not None:  # did the agent still have the task in view when it decided its last action?
        last_model = next(s.id for s in reversed(steps) if isinstance(s, ModelStep))
        verifiers += (VerifierSpec(type="context_requires", name="task-in-final-context", step=last_model,
                                   item=task),)
    src = rec.source
    desc = (f"Replay of {src['agent']}{' / ' + rec.model if rec.model else ''} on {src['instance_id']}: "
            f"{turns} model turns" + ("" if rec.outcome is None else f", recorded outcome {rec.outcome}"))
    return checked(rec, WorkflowSpec(
        name=rec.name, description=desc, budget_tokens=budget_tokens, steps=tuple(steps), verifiers=verifiers,
        labels={"format": str(src["format"]), CONTEXT_CHECKS_LABEL: checks_label(verifiers)}, source=src,
    ))
