"""Read models handed to verifiers, graders and the CLI.

An :class:`EpisodeView` is an owned, immutable snapshot of one branch of one run
at a fixed LSN: frozen Structs and tuples only, copied out of the folded state,
never a handle that re-reads anything. Failed and superseded attempts are kept;
context partitions are inline; prompt and output bodies are by reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.input import requestfold
from reel.shared.core.input.requeststate import InputRecord
from reel.shared.core.run.eventfields import UsageSource, usage_source
from reel.shared.core.run.events import BlobRef, ContextPartition, StepKind, Usage, Verdict
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ExecutorId, RunId, StepId
from reel.shared.core.run.state import (
    AttemptState,
    AttemptStatus,
    BranchState,
    RunState,
    RunStatus,
    StepStatus,
    Timer,
    attempts_status,
    step_statuses,
    workspace_as_of,
)


class AttemptView(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt as a verifier sees it.

    Attributes:
        status: ``dispatched`` (intent with no outcome yet), ``succeeded`` or ``failed``.
        superseded: a later attempt of the same step exists while this one is
            still ``dispatched`` (its executor died; recovery may resolve it).
        context: the ContextPartition captured at pack time (model steps; ``None`` for tool steps).
        usage: tokens, latency (ms), cost (USD).
    """

    step_id: StepId
    attempt: AttemptNo
    status: AttemptStatus
    superseded: bool = False
    executor_id: ExecutorId
    dispatched_lsn: LSN
    outcome_lsn: LSN | None = None
    prompt_ref: BlobRef | None = None
    output_ref: BlobRef | None = None
    context: ContextPartition | None = None
    usage: Usage = Usage()
    error_kind: str | None = None
    error_message: str | None = None
    recovered: bool = False
    truncated: bool | msgspec.UnsetType = msgspec.UNSET  # the output is the head of a longer one (not encoded unset)
    finish_reason: str | msgspec.UnsetType | None = msgspec.UNSET
    error_ref: BlobRef | msgspec.UnsetType = msgspec.UNSET


class StepView(msgspec.Struct, frozen=True, kw_only=True):
    """One step of the branch with all its attempts (failed ones included), in order.

    An agent step (kind ``agent``, no attempts of its own) is followed by its turns
    (kind ``model``) and tool calls (kind ``tool``), which name it as ``parent_step``.
    The other fields below are set only where they apply (unset fields are not encoded).

    Attributes:
        parent_step, turn: the agent step and turn (1-based) of a turn or tool call.
        tool_name, call_id: the tool a call called and the id the model sees it by.
        is_error: a tool call's result is an error observation for the model (the call failed for good:
            a tool error, invalid arguments, an unknown tool, an unknown outcome, a human's rejection).
        output_ref, error_kind: an agent step's output (its final turn's) or why it failed.
        input: a tool call that asked a human first: the request (who was asked, the question, the
            deadline) and its answer (approved, edited arguments, rejected with a note, answered), or
            ``closed_lsn`` when the run was cancelled while it was open. The call's status is
            ``awaiting_input`` while it is open; a rejection is ``failed``, an answer ``succeeded``.
        status: derived from the attempts (:func:`reel.shared.core.run.state.step_statuses`), except on the active
            branch of a cancelled run, where a step the cancel stopped in flight (``running``, ``retrying``,
            ``awaiting_input``; an agent's call it had asked for and not yet run) reads ``cancelled``
            (:func:`stopped_by_cancel`); its attempts stay as recorded (one the cancel's executor never
            resolved stays ``dispatched``).
    """

    step_id: StepId
    kind: StepKind
    status: StepStatus
    attempts: tuple[AttemptView, ...] = ()
    parent_step: StepId | msgspec.UnsetType = msgspec.UNSET
    turn: int | msgspec.UnsetType = msgspec.UNSET
    tool_name: str | msgspec.UnsetType = msgspec.UNSET
    call_id: str | msgspec.UnsetType = msgspec.UNSET
    is_error: bool | msgspec.UnsetType = msgspec.UNSET
    output_ref: BlobRef | msgspec.UnsetType | None = msgspec.UNSET
    error_kind: str | msgspec.UnsetType | None = msgspec.UNSET
    input: InputRecord | msgspec.UnsetType = msgspec.UNSET

    @property
    def final_attempt(self) -> AttemptView | None:
        """The last non-recovered success, else the last success, else the last attempt."""
        wins = [a for a in self.attempts if a.status == AttemptStatus.SUCCEEDED]
        own = [a for a in wins if not a.recovered]
        if own or wins:
            return (own or wins)[-1]
        return self.attempts[-1] if self.attempts else None


class BranchInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One branch of the lineage: its parent and where it forked (LSN, step)."""

    branch_id: BranchId
    parent_branch_id: BranchId | None = None
    fork_lsn: LSN | None = None
    from_step: StepId | None = None


class EpisodeView(msgspec.Struct, frozen=True, kw_only=True):
    """A frozen view of one branch of one run at ``snapshot_lsn``.

    Attributes:
        lineage: the branch and its ancestors, root first.
        steps: every step in workflow order, each with all attempts.
        verdicts: verdicts recorded at or below ``snapshot_lsn``.
        usage: the sum over every attempt (failed ones too), whatever its source.
        usage_by_source: the same sums per usage source (``reported``, ``recorded``, ``estimated``,
            ``none``; only those present): an estimate is never mixed into what a server reported. Unset
            (not encoded) when no attempt's usage says its source (logs recorded before sources were).
        outcome, context_checks: set only by readers that report a completed run (``reel show
            --json``): its reported outcome (``unlabelled`` without an outcome verifier) and the
            verdicts of its context checks (:mod:`reel.shared.core.verify.verification`); unset and not encoded in
            the views verifiers get.
        workspace: the manifest of the branch's workspace as of ``snapshot_lsn``
            (:func:`~reel.shared.core.run.state.workspace_as_of`; materialise it with
            ``reel.shared.application.workspace.materialise``); unset (not encoded) for a run without one.
    """

    run_id: RunId
    workflow_name: str
    branch_id: BranchId
    snapshot_lsn: LSN
    status: RunStatus
    lineage: tuple[BranchInfo, ...]
    steps: tuple[StepView, ...]
    verdicts: tuple[Verdict, ...] = ()
    usage: Usage = Usage()
    usage_by_source: dict[str, Usage] | msgspec.UnsetType = msgspec.UNSET
    outcome: str | msgspec.UnsetType = msgspec.UNSET
    context_checks: tuple[Verdict, ...] | msgspec.UnsetType = msgspec.UNSET
    workspace: BlobRef | msgspec.UnsetType = msgspec.UNSET

    def attempts(self) -> Iterator[AttemptView]:
        """Every attempt of every step, in step then attempt order."""
        for s in self.steps:
            yield from s.attempts

    def requests(self) -> Iterator[tuple[StepView, InputRecord]]:
        """Every tool call that asked a human, with its request (and answer), in step order."""
        for s in self.steps:
            if isinstance(s.input, InputRecord):
                yield s, s.input

    def step(self, step_id: str) -> StepView:
        """The step named ``step_id``. Raises KeyError."""
        for s in self.steps:
            if s.step_id == step_id:
                return s
        raise KeyError(step_id)

    @property
    def failed_attempts(self) -> int:
        """How many attempts failed (the learning signal)."""
        return sum(1 for a in self.attempts() if a.status == AttemptStatus.FAILED)


def _lineage(state: RunState, branch_id: BranchId) -> tuple[BranchInfo, ...]:
    out: list[BranchInfo] = []
    current: BranchId | None = branch_id
    while current is not None:
        b = state.branches[current]
        out.append(BranchInfo(branch_id=b.branch_id, parent_branch_id=b.parent_branch_id,
                              fork_lsn=b.fork_lsn, from_step=b.from_step))
        current = b.parent_branch_id
    return tuple(reversed(out))


IN_FLIGHT: frozenset[StepStatus] = frozenset({StepStatus.RUNNING, StepStatus.RETRYING, StepStatus.AWAITING_INPUT})
"""Step statuses of work under way: what a run's cancel stops (the step then reads ``cancelled``)."""


def stopped_by_cancel(status: StepStatus, cancelled: bool) -> StepStatus:
    """``cancelled`` for a step in flight (:data:`IN_FLIGHT`) when its branch was cancelled, else ``status``.

    A view-only derivation: the fold keeps each attempt's own record (cancel is
    terminal for the run; the executor records ``attempt_cancelled`` for what it stops, but a
    step between attempts, an agent between turns or a hand-written log's open intent has none).
    """
    return StepStatus.CANCELLED if cancelled and status in IN_FLIGHT else status


def build_episode_view(state: RunState, branch_id: BranchId | None = None) -> EpisodeView:
    """Copy the folded state of one branch into a frozen :class:`EpisodeView`.

    The snapshot LSN is ``state.head_lsn``: fold up to the pinned LSN first
    (``fold(commits, upto_lsn=P)``) to build the view at P.

    Raises:
        KeyError: unknown branch.
    """
    bid = branch_id or state.active_branch
    branch = state.branches[bid]
    steps: list[StepView] = []
    totals = [0, 0, 0.0, 0.0]
    cancelled = state.status == RunStatus.CANCELLED and bid == state.active_branch  # cancel stops the active one
    timer = branch.timer if state.status == RunStatus.SLEEPING and bid == state.active_branch else None
    asleep = timer.step_id if isinstance(timer, Timer) else None  # the step the run's timer waits on
    for decl, derived in zip(state.steps, step_statuses(state, bid), strict=True):
        status = StepStatus.SLEEPING if decl.step_id == asleep else stopped_by_cancel(derived, cancelled)
        if decl.kind == "agent":
            steps.extend(_agent_views(branch, decl.step_id, status, totals, cancelled))
            continue
        steps.append(StepView(step_id=decl.step_id, kind=decl.kind, status=status,
                              attempts=_attempt_views(branch.attempts.get(decl.step_id, ()), totals)))
    return EpisodeView(
        run_id=state.run_id, workflow_name=state.workflow_name, branch_id=bid, snapshot_lsn=state.head_lsn,
        status=state.status, lineage=_lineage(state, bid), steps=tuple(steps),
        verdicts=tuple(v for v in state.verdicts if v.branch_id == bid),
        usage=Usage(input_tokens=int(totals[0]), output_tokens=int(totals[1]), latency_ms=totals[2],
                    cost_usd=totals[3]),
        usage_by_source=usage_by_source(a for s in steps for a in s.attempts),
        workspace=_or_unset(workspace_as_of(state, bid)),
    )


def _or_unset(ref: BlobRef | None) -> BlobRef | msgspec.UnsetType:
    return msgspec.UNSET if ref is None else ref


SOURCE_ORDER: tuple[UsageSource, ...] = ("reported", "recorded", "estimated", "none")


def usage_by_source(attempts: Iterable[AttemptView]) -> dict[str, Usage] | msgspec.UnsetType:
    """Usage summed per source (:data:`~reel.shared.core.run.eventfields.UsageSource`), in
    :data:`SOURCE_ORDER`, only the sources present (an unlabelled usage counts as ``reported``); unset when
    no attempt's usage is labelled (a log recorded before sources were: :attr:`EpisodeView.usage` says it all)."""
    sums: dict[str, list[float]] = {}
    labelled = False
    for a in attempts:
        labelled = labelled or not isinstance(a.usage.source, msgspec.UnsetType)
        t = sums.setdefault(usage_source(a.usage), [0, 0, 0.0, 0.0])
        t[0] += a.usage.input_tokens
        t[1] += a.usage.output_tokens
        t[2] += a.usage.latency_ms
        t[3] += a.usage.cost_usd
    if not labelled:
        return msgspec.UNSET
    return {k: Usage(input_tokens=int(sums[k][0]), output_tokens=int(sums[k][1]), latency_ms=sums[k][2],
                     cost_usd=sums[k][3], source=k) for k in SOURCE_ORDER if k in sums}


def _attempt_views(attempts: Sequence[AttemptState], totals: list[float]) -> tuple[AttemptView, ...]:
    views = []
    for i, a in enumerate(attempts):
        views.append(AttemptView(
            step_id=a.step_id, attempt=a.attempt, status=a.status,
            superseded=a.status == AttemptStatus.DISPATCHED and i < len(attempts) - 1,
            executor_id=a.executor_id, dispatched_lsn=a.dispatched_lsn, outcome_lsn=a.outcome_lsn,
            prompt_ref=a.prompt_ref, output_ref=a.output_ref, context=a.context, usage=a.usage,
            error_kind=a.error_kind, error_message=a.error_message, recovered=a.recovered, truncated=a.truncated,
            finish_reason=a.finish_reason, error_ref=a.error_ref,
        ))
        totals[0] += a.usage.input_tokens
        totals[1] += a.usage.output_tokens
        totals[2] += a.usage.latency_ms
        totals[3] += a.usage.cost_usd
    return tuple(views)


def _agent_views(branch: BranchState, agent: StepId, status: StepStatus, totals: list[float], cancelled: bool
                 ) -> Iterator[StepView]:
    """The agent step's own view, then one per turn and tool call, in step order.

    Its calls not yet run when it ended are ``skipped``; when the run's cancel stopped it
    (``cancelled``, no ``agent_finished``), those and the ones in flight are ``cancelled``.
    """
    rec = turnfold.record(branch, agent)
    done = rec.finished if rec is not None else None
    yield StepView(step_id=agent, kind="agent", status=status, output_ref=done.output_ref if done else None,
                   error_kind=done.error_kind if done else None)
    for d in turnfold.declarations(branch, agent):
        attempts = branch.attempts.get(d.step_id, ())
        own = attempts_status(attempts, d.max_attempts)
        asked = requestfold.request_of(branch, d.step_id)
        gate = asked.status if asked is not None else "none"
        if gate in ("open", "rejected", "answered"):
            own = {"open": StepStatus.AWAITING_INPUT, "rejected": StepStatus.FAILED}.get(gate, StepStatus.SUCCEEDED)
        if done is not None and own in (StepStatus.PENDING, StepStatus.AWAITING_INPUT):
            own = StepStatus.SKIPPED
        elif cancelled and done is None and (own == StepStatus.PENDING or own in IN_FLIGHT):
            own = StepStatus.CANCELLED  # asked for, or under way, when the cancel stopped the agent
        if d.kind == "turn":
            yield StepView(step_id=d.step_id, kind="model", status=own, attempts=_attempt_views(attempts, totals),
                           parent_step=agent, turn=d.turn)
        else:
            yield StepView(step_id=d.step_id, kind="tool", status=own, attempts=_attempt_views(attempts, totals),
                           parent_step=agent, turn=d.turn, tool_name=d.tool_name or "", call_id=d.call_id or "",
                           is_error=own == StepStatus.FAILED, input=asked if asked is not None else msgspec.UNSET)


_enc = msgspec.json.Encoder()


def serialize_view(view: EpisodeView) -> bytes:
    """Canonical bytes of a view (what the snapshot-barrier tests compare)."""
    return _enc.encode(view)
