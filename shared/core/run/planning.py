"""The executor's pure core: what to do next, and what a model step reads (its candidates are an agent's first
turn's: :func:`reel.shared.core.agent.turncontext.model_turn`).

:func:`next_action` decides from the folded state alone; the executor service
(services/executor) performs the action, commits, applies the commit to its
state and asks again. No I/O, clock or randomness here. Inside an agent step the
decision is :func:`reel.shared.core.agent.actions.agent_action`'s; its actions (``Wait``,
``DispatchTurn``, ``DispatchCalls``, …) and what each commit carries are
described in :mod:`reel.shared.core.agent.actions`.

Attempt numbering: attempts are numbered 1, 2, … per step and branch. A step
fails when ``max_attempts`` attempts have *failed* (or one failed non-retryably).
An attempt left ``dispatched`` by a dead executor does not count: the next
executor supersedes it with a new attempt and recovery resolves it later — or, for a
command tool that is not retry-safe, adopts its stored output (``Dispatch.supersedes``)
(docs/mutators.md, Recovery).
"""

from __future__ import annotations

import codecs
import hashlib

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.agent.actions import (
    AdoptTurn,
    AgentAction,
    AwaitInput,
    CallAttempt,
    DispatchCalls,
    DispatchTurn,
    FinishAgent,
    InFlight,
    ResolveUnknown,
    Wait,
    agent_action,
)
from reel.shared.core.pack.packer import PackPolicy
from reel.shared.core.pack.tokencount import TokenCounter
from reel.shared.core.run import timers
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.ids import AttemptNo, BranchId, StepId
from reel.shared.core.run.state import (
    DRIVABLE,
    STEP_TERMINAL,
    AttemptStatus,
    RunState,
    RunStatus,
    StepStatus,
    final_success,
    own_status,
)
from reel.shared.core.run.timers import FinishSleep, Sleep
from reel.shared.core.workflow.spec import AgentStep, ModelStep, WorkflowSpec

__all__ = ["Action", "AdoptTurn", "AwaitInput", "CallAttempt", "Claim", "Dispatch", "DispatchCalls", "DispatchTurn",
           "EnterVerifying", "FinishAgent", "FinishSleep", "ResolveUnknown", "Rest", "Sleep", "Wait", "next_action"]


class Claim(msgspec.Struct, frozen=True):
    """Commit ``run_started`` for this executor (first run, or taking over a dead one's)."""


class Dispatch(msgspec.Struct, frozen=True):
    """Start attempt ``attempt`` of ``step_id`` on ``branch_id``; ``supersedes``: the attempt before it, when
    that one is still ``dispatched`` by no drive of this executor (a dead executor's orphan, whose stored
    output — its recovery marker — is adopted instead of running the step again, if there is one)."""

    branch_id: BranchId
    step_id: StepId
    attempt: AttemptNo
    supersedes: AttemptNo | None = None


class EnterVerifying(msgspec.Struct, frozen=True):
    """Every step of the branch is terminal: commit ``run_verifying``."""

    branch_id: BranchId


class Rest(msgspec.Struct, frozen=True):
    """Nothing for an executor to do (verifying, completed, cancelled)."""

    status: RunStatus


Action = Claim | Dispatch | EnterVerifying | Rest | FinishSleep | AgentAction


def next_action(state: RunState, executor_id: str, in_flight: InFlight = (), *, start: int = 0) -> Action:
    """The next thing ``executor_id`` must do to drive ``state`` towards ``Verifying``.

    Args:
        in_flight: ``(branch, step, attempt)`` of the attempts this executor is running (its tasks); any
            other attempt still ``dispatched`` is an orphan and is superseded. Empty (the sequential
            executor): nothing is waited for. See :mod:`reel.shared.core.agent.actions` for the agent actions.
        start: the steps before this position are known to have succeeded on the active branch (a
            cursor the caller keeps with :func:`succeeded_prefix`): only the rest is looked at, so a
            step's planning costs O(1) whatever the run's length. 0 looks at every step.
    """
    if state.status not in DRIVABLE:
        return Rest(state.status)
    if state.executor_id != executor_id:
        return Claim()
    bid = state.active_branch
    branch = state.branches[bid]
    steps = state.steps
    for i in range(start, len(steps)):
        decl = steps[i]
        status = own_status(branch, decl)
        if status == StepStatus.FAILED:
            break  # every later step is skipped (step_statuses): the branch is terminal
        if status in STEP_TERMINAL:
            continue
        if decl.kind == "agent":
            return agent_action(state, bid, decl, in_flight)
        attempts = branch.attempts.get(decl.step_id, ())
        if decl.kind == "sleep":
            woke = timers.woke_for(branch, decl.step_id)
            if woke is None or woke.woke_ms is None:
                return Sleep(bid, decl.step_id, "sleep")
            return FinishSleep(bid, decl.step_id, AttemptNo(len(attempts) + 1), woke.wake_ms, woke.woke_ms)
        if attempts and timers.waits(attempts[-1]) and not timers.resumable(branch, attempts[-1]):
            return Sleep(bid, decl.step_id, "resume_after", timers.resume_at(attempts[-1]))
        if attempts and attempts[-1].status == AttemptStatus.DISPATCHED and (
                bid, decl.step_id, attempts[-1].attempt) in in_flight:
            return Wait()
        if not attempts:
            return Dispatch(bid, decl.step_id, AttemptNo(1))
        last = attempts[-1]
        orphan = AttemptNo(last.attempt) if last.status == AttemptStatus.DISPATCHED else None
        return Dispatch(bid, decl.step_id, AttemptNo(last.attempt + 1), supersedes=orphan)
    if any(b == bid for b, _, _ in in_flight):
        return Wait()  # e.g. calls of an agent that a fatal tool ended: record their outcomes first
    return EnterVerifying(bid)


def claim_defers(state: RunState, executor_id: str, owner_alive: bool) -> bool:
    """True when ``executor_id`` must not claim ``state``: another executor owns it and holds its lease
    (``owner_alive``, as read from the leases bucket's leader). A run changes hands only when its owner is
    provably gone: an executor writes its lease before it takes any command, and gives its runs up (kills its
    tools, writes nothing more) before the server can let its lease expire (shared/nats/leases.py), so a
    live owner's attempt — in flight, or about to be dispatched — is never superseded and no tool runs twice
    on two healthy executors. A duplicate start or resume that reaches another executor is handed back to
    the queue until the owner takes it or is gone (docs/architecture.md, "One writer per run"). Pure.
    """
    owner = state.executor_id
    return owner is not None and owner != executor_id and owner_alive


def has_open_intent(state: RunState) -> bool:
    """True if any attempt of any branch is still ``dispatched`` (an intent with no outcome). Pure."""
    return any(a.status == AttemptStatus.DISPATCHED
               for b in state.branches.values() for atts in b.attempts.values() for a in atts)


def succeeded_prefix(state: RunState, branch_id: BranchId, start: int = 0) -> int:
    """How many leading steps have succeeded on ``branch_id``, counting on from ``start`` (steps the
    caller knows succeeded: a step that succeeded on a branch stays so — outcomes are never taken
    back, and a rewind makes a new branch). Kept as a cursor, O(1) per step amortised."""
    branch = state.branches[branch_id]
    steps, n = state.steps, start
    while n < len(steps) and own_status(branch, steps[n]) == StepStatus.SUCCEEDED:
        n += 1
    return n


class Cursor:
    """One drive's planning cursor: how many leading steps of the active branch have succeeded
    (:func:`succeeded_prefix`), advanced on the states the log gave, so that planning a step costs O(1)
    whatever the run's length (``next_action(..., start=cursor.at(state))``). A new active branch starts it
    over. Pure, but it keeps its count between calls: one per drive."""

    def __init__(self) -> None:
        self.branch: str | None = None
        self.n = 0

    def at(self, state: RunState) -> int:
        """The prefix on ``state`` (a state of the log, never a preview: it would advance on a guess)."""
        if state.active_branch != self.branch:
            self.branch, self.n = state.active_branch, 0
        self.n = succeeded_prefix(state, state.active_branch, self.n)
        return self.n

    def peek(self, state: RunState) -> int:
        """The prefix on a preview of the next state, without advancing the cursor."""
        n = self.n if state.active_branch == self.branch else 0
        return succeeded_prefix(state, state.active_branch, n)


def outcome_recorded(state: RunState, branch_id: BranchId, step_id: StepId, attempt: AttemptNo) -> bool:
    """True when attempt ``attempt`` of ``step_id`` on ``branch_id`` takes no outcome commit any more.

    The executor decides this after its outcome commit lost the fence (a cancel, a
    rewind, recovery committed while the side effect ran): the outcome is still a
    fact about the attempt and is recorded on top of their commit, unless the
    attempt was resolved meanwhile (recovery recorded it) or is no longer on the
    branch. Pure.

    Raises:
        KeyError: ``branch_id`` is not a branch of the run.
    """
    found = next((a for a in state.branches[branch_id].attempts.get(step_id, ()) if a.attempt == attempt), None)
    return found is None or found.status != AttemptStatus.DISPATCHED


def succeeded_output(state: RunState, branch_id: BranchId, step_id: StepId) -> BlobRef | None:
    """The output BlobRef of the step's final success on ``branch_id``
        (:func:`reel.shared.core.run.state.final_success`);
    of an agent step, its ``agent_finished`` output (the final turn's text)."""
    rec = turnfold.record(state.branches[branch_id], step_id)
    if rec is not None:
        return rec.finished.output_ref if rec.finished is not None and rec.finished.status == "succeeded" else None
    win = final_success(state.branches[branch_id].attempts.get(step_id, ()))
    return win.output_ref if win is not None else None


def content_hash(text: str) -> str:
    """sha256 hex of a context item's text (duplicate detection)."""
    return hashlib.sha256(text.encode()).hexdigest()


READ_BYTES_PER_TOKEN = 16
"""How many bytes of an earlier output a model step reads per token of its budget (bytes/token): an output
longer than that much of the budget (or of ``max_item_tokens``) could not fit — text runs 3–4 bytes per
token (:mod:`reel.shared.core.pack.tokencount`) — so only its head and tail are read (:func:`read_bound`)."""


def read_bound(policy: PackPolicy) -> int:
    """Bytes of one earlier output a step packing under ``policy`` reads at most (half head, half tail)."""
    tokens = policy.budget_tokens if policy.max_item_tokens is None else min(policy.budget_tokens,
                                                                             policy.max_item_tokens)
    return max(1, tokens) * READ_BYTES_PER_TOKEN


def trimmed_text(head: bytes, tail: bytes, size_bytes: int) -> str:
    """An output's text when only its ``head`` and ``tail`` were read (pure): both decoded (a character cut at
    either edge is dropped), with a note between them saying how many of its ``size_bytes`` were left out."""
    first = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=False)
    skip = next((i for i, b in enumerate(tail[:4]) if b & 0xC0 != 0x80), 0)  # continuation bytes of a cut char
    last = tail[skip:].decode("utf-8", errors="replace")
    omitted = size_bytes - len(head) - len(tail)
    return (f"{first}\n[reel: output trimmed — {omitted} of its {size_bytes} bytes left out here, between the "
            f"first {len(head)} and the last {len(tail)}: more than this step's context budget can use]\n{last}")


def needed_outputs(step: ModelStep, spec: WorkflowSpec) -> list[str]:
    """Earlier step ids whose outputs a model step's candidates need
    (:func:`reel.shared.core.agent.turncontext.model_items`)."""
    need = [i.from_step for i in step.context if i.from_step is not None]
    if step.include_previous_outputs:
        for s in spec.steps:
            if s.id == step.id:
                break
            need.append(s.id)
    return list(dict.fromkeys(need))


class TextFacts:
    """Token count and content hash per text, computed once per distinct text (bounded memo).

    A model step's candidates are mostly the previous step's candidates plus one or
    two new items; without the memo a run would recount every earlier message at
    every step (O(steps²) counting). Pure: the same text always maps to the same facts.
    """

    def __init__(self, counter: TokenCounter, max_entries: int = 50_000) -> None:
        self.counter = counter
        self._facts: dict[str, tuple[int, str]] = {}
        self._max = max_entries

    def __call__(self, text: str) -> tuple[int, str]:
        """``(tokens, sha256 hex)`` of ``text``."""
        hit = self._facts.get(text)
        if hit is None:
            if len(self._facts) >= self._max:
                self._facts.clear()
            hit = self._facts[text] = (self.counter.count(text), content_hash(text))
        return hit


def policy_for(step: ModelStep | AgentStep, spec: WorkflowSpec) -> PackPolicy:
    """The step's packing policy, with the workflow's default budget filled in (tokens)."""
    p = step.policy
    return PackPolicy(
        budget_tokens=p.budget_tokens if p.budget_tokens is not None else spec.budget_tokens,
        exclude_kinds=p.exclude_kinds, max_item_tokens=p.max_item_tokens, drop_stale=p.drop_stale,
        dedupe=p.dedupe,
    )
