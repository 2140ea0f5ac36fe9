"""The event model: what one commit on a run's subject can say.

A *commit* is one JetStream message on ``reel.ev.<run_id>``; its body is the JSON
encoding of :class:`Commit`, which carries one or more tagged events. The commit's
LSN is the stream sequence the server assigns to that message, so it is never
part of the body. Events are frozen, tagged ``msgspec.Struct``s; every time is a
field (``*_ms``, Unix epoch milliseconds) so the fold never reads a clock.

Schema evolution (msgspec's rules): new fields get defaults, a field never changes
type; a breaking change bumps :data:`SCHEMA_VERSION` and adds a decoder case.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from reel.shared.core.errors import UnknownEventType
from reel.shared.core.input.requestevents import (
    InputAnswered as InputAnswered,  # human input: shared/core/input/requestevents.py
)
from reel.shared.core.input.requestevents import InputRequested as InputRequested
from reel.shared.core.input.requestevents import RunAwaitingInput as RunAwaitingInput
from reel.shared.core.run.eventbase import Event as Event
from reel.shared.core.run.eventfields import BlobRef as BlobRef  # value types: shared/core/run/eventfields.py
from reel.shared.core.run.eventfields import Budget as Budget
from reel.shared.core.run.eventfields import CodeIdentity as CodeIdentity
from reel.shared.core.run.eventfields import ContextPartition as ContextPartition
from reel.shared.core.run.eventfields import HaltReason as HaltReason
from reel.shared.core.run.eventfields import StepDecl as StepDecl
from reel.shared.core.run.eventfields import StepKind as StepKind
from reel.shared.core.run.eventfields import Usage as Usage
from reel.shared.core.run.eventfields import UsageSource as UsageSource
from reel.shared.core.run.eventfields import Verdict as Verdict
from reel.shared.core.run.eventfields import VerdictStatus as VerdictStatus
from reel.shared.core.run.forkedits import ContextEdit
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, CommitId, ExecutorId, RunId, StepId

SCHEMA_VERSION = 1

DeclaredKind = Literal["turn", "tool_call"]
AgentStatus = Literal["succeeded", "failed"]
ARGUMENTS_INLINE_MAX = 2048  # bytes of a tool call's raw JSON arguments carried inline (larger: a blob)
RunOutcome = Literal["passed", "failed", "error", "succeeded"]


class RunCreated(Event, tag="run_created", kw_only=True, frozen=True):
    """A run exists and is ``Pending``. The workflow body is in the blob store.

    ``source_dir``: the folder of the workflow's file, from the start command (where its ``python:`` tools are
    looked up first, whichever executor drives the run); unset (not encoded) for a run started without a file,
    so older logs read the same.
    ``budget``: the run's spend limits (the workflow's ``budget:`` over the namespace's default, decided when the
    run was created); unset (not encoded) for a run without limits, and in older logs.
    ``workspace``: the manifest of the workspace every branch starts from (the workflow's ``workspace:`` folder as
    the executor snapshotted it at start: docs/workspaces.md); unset (not encoded) for a run without one.
    """

    run_id: RunId
    branch_id: BranchId
    workflow_name: str
    workflow_ref: BlobRef
    steps: tuple[StepDecl, ...]
    verifiers: tuple[str, ...] = ()
    idempotency_key: str | None = None
    created_ms: int
    labels: dict[str, str] = {}
    source_dir: str | msgspec.UnsetType = msgspec.UNSET
    budget: Budget | msgspec.UnsetType = msgspec.UNSET
    workspace: BlobRef | msgspec.UnsetType = msgspec.UNSET


class RunStarted(Event, tag="run_started", kw_only=True, frozen=True):
    """An executor claimed the run: ``Pending``/``Running`` → ``Running``."""

    executor_id: ExecutorId
    at_ms: int


class AttemptDispatched(Event, tag="attempt_dispatched", kw_only=True, frozen=True):
    """The intent, committed *before* the side effect.

    For model steps ``prompt_ref`` and ``context`` are set, in this same commit
    (the partition is known only at pack time). ``code``: the identity of the code the attempt runs
    (:class:`~reel.shared.core.run.eventfields.CodeIdentity`); unset (not encoded) in older logs. A new attempt
    of a step supersedes any earlier attempt of that step that is still ``dispatched`` (its executor died).
    """

    branch_id: BranchId
    step_id: StepId
    attempt: AttemptNo
    executor_id: ExecutorId
    at_ms: int
    prompt_ref: BlobRef | None = None
    context: ContextPartition | None = None
    code: CodeIdentity | msgspec.UnsetType = msgspec.UNSET


class AttemptSucceeded(Event, tag="attempt_succeeded", kw_only=True, frozen=True):
    """The outcome of a dispatched attempt: success, with its output blob.

    ``truncated``: the tool printed more than its ``max_output_bytes`` and ``on_overflow: truncate`` kept
    the head (``output_ref`` is that head), or a model's answer was cut (finish reason ``length`` or
    ``content_filter``) and the step's ``on_truncated: continue`` took it as it is; unset (not encoded)
    otherwise, so older logs read the same.
    ``finish_reason``: a model attempt's, exactly as the server sent it (``stop``, ``length``,
    ``tool_calls``, ``content_filter``, any other string as-is; ``None``: the server sent none); unset
    (not encoded) on tool attempts and in logs recorded before finish reasons were.
    ``workspace``: a tool call's: the manifest of the branch's workspace as the call left it, when it differs from
    the one before (docs/workspaces.md); unset (not encoded) when the call changed nothing, or there is none.
    """

    branch_id: BranchId
    step_id: StepId
    attempt: AttemptNo
    output_ref: BlobRef
    usage: Usage = Usage()
    at_ms: int
    recovered: bool = False
    truncated: bool | msgspec.UnsetType = msgspec.UNSET
    finish_reason: str | msgspec.UnsetType | None = msgspec.UNSET
    workspace: BlobRef | msgspec.UnsetType = msgspec.UNSET

    @classmethod
    def from_marker(cls, branch_id: BranchId, step_id: StepId, attempt: AttemptNo, output_ref: BlobRef,
                    at_ms: int) -> AttemptSucceeded:
        """The success of an attempt whose executor stored its output's recovery marker (``output_ref``) but
        never committed the outcome: ``recovered``, no usage (what the call cost was never recorded). The one
        shape recovery, an adopting tool step and an agent's orphaned call give it."""
        return cls(branch_id=branch_id, step_id=step_id, attempt=attempt, output_ref=output_ref, at_ms=at_ms,
                   recovered=True)


class AttemptFailed(Event, tag="attempt_failed", kw_only=True, frozen=True):
    """The outcome of a dispatched attempt: failure, kept in the log forever.

    Attributes:
        error_kind: why (``rate_limited``, ``server_error``, ``truncated`` …; docs/models.md).
        message: one line; a server's error keeps the server's own message.
        finish_reason: a model attempt that got an answer and failed on it (``truncated``: ``length``,
            ``content_filter``), the reason as the server sent it; unset (not encoded) otherwise.
        error_ref: the whole body behind the error (a server's error response, or the cut answer of a
            ``truncated`` attempt), in the blob store; unset (not encoded) when there is none.
        resume_at_ms: with ``error_kind`` ``resume_after``: the tool asked to be run again at this time (epoch
            ms) — not a failure of the step, never counted against ``max_attempts``; unset (not encoded)
            otherwise.
        workspace: as :attr:`AttemptSucceeded.workspace` (a failed call may have changed files too).
    """

    branch_id: BranchId
    step_id: StepId
    attempt: AttemptNo
    error_kind: str
    message: str
    retryable: bool = True
    usage: Usage = Usage()
    at_ms: int
    recovered: bool = False
    finish_reason: str | msgspec.UnsetType | None = msgspec.UNSET
    error_ref: BlobRef | msgspec.UnsetType = msgspec.UNSET
    resume_at_ms: int | msgspec.UnsetType = msgspec.UNSET
    workspace: BlobRef | msgspec.UnsetType = msgspec.UNSET


class AttemptCancelled(Event, tag="attempt_cancelled", kw_only=True, frozen=True):
    """The outcome of a dispatched attempt the run's cancel stopped: terminal, not a failure.

    Recorded by the executor that interrupted the side effect (its process group killed,
    its task cancelled, its HTTP call aborted), or by recovery when that executor is
    dead (``recovered``). Any outcome of an attempt on the active branch of a cancelled
    run is recorded as this, never as a success or a failure (docs/mutators.md).
    """

    branch_id: BranchId
    step_id: StepId
    attempt: AttemptNo
    reason: str = ""
    usage: Usage = Usage()
    at_ms: int
    recovered: bool = False


class RunVerifying(Event, tag="run_verifying", kw_only=True, frozen=True):
    """Every step of the branch is terminal; the run rests in ``Verifying``."""

    branch_id: BranchId
    at_ms: int


class VerdictRecorded(Event, tag="verdict_recorded", kw_only=True, frozen=True):
    """A verdict (also published on the verdict subject) recorded in the run's log."""

    verdict: Verdict


class RunCompleted(Event, tag="run_completed", kw_only=True, frozen=True):
    """Terminal: every expected verdict for the snapshot is in (or none was configured)."""

    branch_id: BranchId
    outcome: RunOutcome
    snapshot_lsn: LSN = LSN(0)
    at_ms: int


class RunCancelled(Event, tag="run_cancelled", kw_only=True, frozen=True):
    """Terminal: cancelled from ``Pending``, ``Running``, ``Awaiting input`` or ``Verifying``.

    ``by``: who cancelled, as the cancel command named them (free text; unset: not encoded — nobody was named,
    as in every log written before the field existed)."""

    reason: str = ""
    at_ms: int
    by: str | msgspec.UnsetType = msgspec.UNSET


class BranchForked(Event, tag="branch_forked", kw_only=True, frozen=True):
    """A rewind: a new branch forked from ``parent_branch_id``.

    The new branch inherits the parent's records up to ``fork_lsn`` and, when
    ``from_step`` is set, only the steps before ``from_step``. The parent's
    records never change. The run goes back to ``Running`` on the new branch.
    ``by``: who rewound, as the rewind command named them (free text; unset: not encoded).
    ``edits``: a fork's changes to the context of ``from_step`` (an agent turn) and the turns after it
    (:mod:`reel.shared.core.run.forkedits`); unset (not encoded) for a plain rewind, and in older logs.
    """

    branch_id: BranchId
    parent_branch_id: BranchId
    fork_lsn: LSN
    from_step: StepId | None = None
    at_ms: int
    by: str | msgspec.UnsetType = msgspec.UNSET
    edits: tuple[ContextEdit, ...] | msgspec.UnsetType = msgspec.UNSET


class DeclaredStep(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One dynamic step of an agent: a turn, or one tool call of a turn.

    Attributes:
        step_id: ``<agent>:t<turn>`` or ``<agent>:t<turn>:c<i>`` (:mod:`reel.shared.core.run.stepids`).
        kind: ``turn`` or ``tool_call``.
        turn: the turn (1-based) the step is, or belongs to.
        max_attempts: attempts of this step.
        call_id: the tool-call id echoed back to the model as ``tool_call_id`` (the
            provider's, or one Reel assigned when it was empty or a duplicate).
        tool_name: the tool called; ``arguments`` its raw JSON arguments when at most
            :data:`ARGUMENTS_INLINE_MAX` bytes, else ``arguments_ref`` (a blob).
        retry_safe: the tool may be re-run after an executor crash; otherwise an
            in-flight attempt left by a dead executor is recorded ``outcome_unknown``.
        fatal: the tool's failure (after its attempts) fails the agent step.
    """

    step_id: StepId
    kind: DeclaredKind
    turn: int
    max_attempts: int = 1
    call_id: str | None = None
    tool_name: str | None = None
    arguments: str | None = None
    arguments_ref: BlobRef | None = None
    retry_safe: bool = False
    fatal: bool = False


class StepsDeclared(Event, tag="steps_declared", kw_only=True, frozen=True):
    """Dynamic steps of the agent step ``parent_step`` on ``branch_id``, in order.

    Turn 1 is declared with its first intent; the calls of turn *t* in the commit of
    turn *t*'s outcome (with their intents); turn *t+1* with the last result of turn *t*.
    """

    branch_id: BranchId
    parent_step: StepId
    steps: tuple[DeclaredStep, ...]


class AgentFinished(Event, tag="agent_finished", kw_only=True, frozen=True):
    """The agent loop of ``step_id`` ended, in the commit of the outcome that ended it.

    Attributes:
        status: ``succeeded`` (a turn made no tool call) or ``failed``.
        output_ref: the final turn's output (the step's output), when succeeded.
        turns: how many turns the loop ran.
        error_kind: ``max_turns``, ``turn_failed``, ``truncated`` (the last turn's answer was cut and the
            step's ``on_truncated`` did not take it) or ``fatal_tool`` when failed.
    """

    branch_id: BranchId
    step_id: StepId
    status: AgentStatus
    output_ref: BlobRef | None = None
    turns: int
    error_kind: str | None = None
    message: str = ""
    at_ms: int


class StepHalted(Event, tag="step_halted", kw_only=True, frozen=True):
    """The run stopped before the next attempt of ``step_id`` on ``branch_id``: that step fails (the branch ends).

    Attributes:
        reason: ``budget_exhausted`` (the attempt's worst case would exceed a limit of the run's budget) or
            ``code_changed`` (the attempt would run other code than the step's tool ran before, under
            ``on_code_change: fail``).
        message: one line naming the limit and the figures, or the code that changed.
        budget: the limit (``max_tokens``, ``max_cost_usd``, ``max_wall_s``, ``max_tool_calls``); ``limit`` its
            value, ``spent`` what the run had spent of it, ``needed`` what the next attempt would take at worst
            (tokens, USD, seconds or calls); unset (not encoded) for ``code_changed``.
    """

    branch_id: BranchId
    step_id: StepId
    reason: HaltReason
    message: str = ""
    budget: str | msgspec.UnsetType = msgspec.UNSET
    limit: float | msgspec.UnsetType = msgspec.UNSET
    spent: float | msgspec.UnsetType = msgspec.UNSET
    needed: float | msgspec.UnsetType = msgspec.UNSET
    at_ms: int


TimerReason = Literal["sleep", "resume_after"]
"""Why a run sleeps: a ``kind: sleep`` step, or a tool's result that asked to be resumed later (docs/workflow.md)."""


class RunSleeping(Event, tag="run_sleeping", kw_only=True, frozen=True):
    """Nothing of ``branch_id`` runs before ``wake_ms``: the run rests in ``sleeping`` and no process holds it.

    Attributes:
        step_id: the ``kind: sleep`` step (``reason`` ``sleep``), or the tool step or agent call whose attempt
            asked to be resumed later (``resume_after``; that attempt's ``attempt_failed`` is in the same commit).
        wake_ms: when the run is to wake (epoch ms); the waker (recovery) commits ``run_woke`` once its clock
            reads this time or later.
        at_ms: when the executor committed it (epoch ms).
    """

    branch_id: BranchId
    step_id: StepId
    wake_ms: int
    reason: TimerReason = "sleep"
    at_ms: int


class RunWoke(Event, tag="run_woke", kw_only=True, frozen=True):
    """The timer of ``run_sleeping`` fired: the run is ``running`` again. ``at_ms`` minus the timer's ``wake_ms``
    is how late the waker was (epoch ms; its clock). Written by recovery, or by the executor itself when the
    time had already passed as it set the timer."""

    branch_id: BranchId
    step_id: StepId
    at_ms: int


AttemptEnd = AttemptSucceeded | AttemptFailed
"""How an attempt ended, as its outcome event says (``AttemptCancelled`` is a cancel's, not the executor's)."""

AnyEvent = (
    RunCreated | RunStarted | AttemptDispatched | AttemptSucceeded | AttemptFailed | AttemptCancelled | RunVerifying
    | VerdictRecorded | RunCompleted | RunCancelled | BranchForked | StepsDeclared | AgentFinished
    | InputRequested | InputAnswered | RunAwaitingInput | StepHalted | RunSleeping | RunWoke
)


class Commit(msgspec.Struct, frozen=True, kw_only=True):
    """One atomic state transition of one run: the body of one JetStream message.

    Attributes:
        v: schema version (:data:`SCHEMA_VERSION`).
        commit_id: unique id, also sent as ``Nats-Msg-Id`` (publish dedup).
        run_id: the run; equals the subject's last token.
        writer: who wrote it (executor id, ``cancel``, ``recovery``…).
        events: one or more events, applied in order.
    """

    v: int = SCHEMA_VERSION
    commit_id: CommitId
    run_id: RunId
    writer: str = ""
    events: tuple[AnyEvent, ...]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Commit)


def encode_commit(commit: Commit) -> bytes:
    """Commit → JSON bytes (the message body)."""
    return _encoder.encode(commit)


def decode_commit(data: bytes) -> Commit:
    """JSON bytes → Commit.

    Raises:
        UnknownEventType: the body holds an event tag this version does not know,
            or a schema version newer than :data:`SCHEMA_VERSION`.
        msgspec.ValidationError / msgspec.DecodeError: any other malformed body.
    """
    try:
        commit = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        if "Invalid value" in str(exc) and "type" in str(exc):
            raise UnknownEventType(f"cannot decode commit: {exc}") from exc
        raise
    if commit.v > SCHEMA_VERSION:
        raise UnknownEventType(f"commit schema v{commit.v} is newer than supported v{SCHEMA_VERSION}")
    return commit
