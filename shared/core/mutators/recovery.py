"""Recovery's pure core: which open intents to resolve, and with what.

An *open intent* is an attempt still ``dispatched`` in a folded run. Its
executor normally commits the outcome; recovery steps in only when it cannot:

* The intent is **resolvable** when it is *settled* — superseded (a later
  attempt of the step exists on that branch), on a branch that is no longer the
  active one (nobody will ever drive it again), or in a run resting in
  ``verifying``/``completed``/``cancelled`` — **and** its writer is gone: the
  executor that dispatched it has no lease entry. A live executor's intent is
  never touched.
* An intent on a forked branch that was *inherited* from an ancestor (its
  dispatch predates the fork; the fold copies it back to ``dispatched`` when the
  outcome came after the fork LSN) has no writer at all on that branch: its
  executor writes on the branch it dispatched on. Once settled, it is resolved
  from the ancestor's own outcome when there is one, else like any lost intent.
* Resolution of a lost intent: when the executor stored the outcome marker
  (``<run>.<branch>.<step>.<attempt>`` in the outcomes KV, written after the
  output blob and before the outcome commit) → ``attempt_succeeded`` with that
  output ref; otherwise (recovery first claims the marker's key, :data:`LOST_MARKER`)
  ``attempt_failed`` with ``error_kind="executor_lost"`` and a message saying the outcome is
  unknown. Both carry ``recovered=True``.
* In a **cancelled** run an intent on the active branch (the one the cancel stopped)
  is resolved ``attempt_cancelled`` whatever the marker says (never succeeded or
  failed after ``run_cancelled``; :func:`reel.shared.core.mutators.cancel.after_cancel`).
* An executor that holds none of its own settled intents in a drive any more (a drive of it
  raised between an intent and its outcome, and the attempt was superseded since — by itself on
  the next drive, or by another executor) resolves them itself the same way (:func:`abandon`):
  its lease says it is alive, so recovery would wait for it forever.
* The latest intent of a step on the active branch of a *running* run is not
  settled: the executor that takes the run over supersedes it with a new
  attempt. When its writer is gone and so is the run's owner, recovery asks for
  that (:attr:`Triage.resume`) instead of resolving it.

The service fetches the facts this module cannot (which executors are live,
which markers exist), and commits what :func:`decide` returns fenced on the head
it folded, so a recovery commit always lands above any snapshot LSN and never
races an executor silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Literal

import msgspec

from reel.shared.core.agent.turnfold import step_ids
from reel.shared.core.decision import Decision, events_or_skip
from reel.shared.core.mutators.cancel import as_cancelled, caught
from reel.shared.core.run.events import AnyEvent, AttemptCancelled, AttemptFailed, AttemptSucceeded, BlobRef
from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ExecutorId, RunId, StepId
from reel.shared.core.run.state import RESTING, AttemptState, AttemptStatus, RunState
from reel.shared.core.wire.subjects import outcome_key

EXECUTOR_LOST = "executor_lost"
LOST_MESSAGE = ("executor {executor_id} was lost before committing an outcome and stored no output: the outcome "
                "is unknown (its side effect may or may not have happened)")
"""The ``attempt_failed`` message of a lost intent without a marker: what is known, and no more."""
LOST_MARKER = b"lost"
"""The body recovery *creates* under an attempt's outcome-marker key before recording the attempt lost. Markers
are only ever created (never overwritten), so a late marker of that attempt — written by an executor that was
frozen past its lease — is refused by the server, and marker and log never disagree."""

WaitReason = Literal["executor_alive", "latest_attempt", "owner_alive"]


class OpenIntent(msgspec.Struct, frozen=True, kw_only=True):
    """One ``dispatched`` attempt of a folded run.

    Attributes:
        branch_id: the branch whose record this is.
        origin_branch_id: the branch it was dispatched on (differs when inherited by a fork).
        superseded: a later attempt of the step exists on ``branch_id``.
        dispatched_lsn: the LSN of the intent commit.
    """

    run_id: RunId
    branch_id: BranchId
    origin_branch_id: BranchId
    step_id: StepId
    attempt: AttemptNo
    executor_id: ExecutorId
    dispatched_lsn: LSN
    superseded: bool

    @property
    def inherited(self) -> bool:
        return self.origin_branch_id != self.branch_id

    @property
    def marker_key(self) -> str:
        """Key of the executor's stored-outcome marker in the outcomes KV."""
        return outcome_key(self.run_id, self.origin_branch_id, self.step_id, self.attempt)

    def describe(self) -> dict[str, object]:
        return {"run": self.run_id, "branch": self.branch_id, "step": self.step_id, "attempt": self.attempt,
                "executor_id": self.executor_id}


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    """An open intent recovery leaves alone, and why."""

    intent: OpenIntent
    reason: WaitReason


class Triage(msgspec.Struct, frozen=True, kw_only=True):
    """What recovery does about one run's open intents.

    Attributes:
        resolve: intents to resolve now (commit :func:`resolution_events`).
        resume: publish ``ResumeRun`` so an executor supersedes a lost latest intent.
        waiting: intents left alone (a live writer, or an executor will supersede them).
    """

    resolve: tuple[OpenIntent, ...] = ()
    resume: bool = False
    waiting: tuple[Waiting, ...] = ()


def origin_branch(state: RunState, branch_id: BranchId, attempt: AttemptState) -> BranchId:
    """The branch ``attempt`` (a record of ``branch_id``) was dispatched on.

    A dispatch on a forked branch comes after the fork commit (``created_lsn``);
    anything older was inherited from the parent.
    """
    branch = state.branches[branch_id]
    while branch.parent_branch_id is not None and attempt.dispatched_lsn < branch.created_lsn:
        branch = state.branches[branch.parent_branch_id]
    return branch.branch_id


def open_intents(state: RunState) -> list[OpenIntent]:
    """Every ``dispatched`` attempt of every branch, in branch then step order (agents' turns and calls too)."""
    out: list[OpenIntent] = []
    for branch_id in sorted(state.branches):
        attempts_by_step = state.branches[branch_id].attempts
        for step_id in step_ids(state.steps, state.branches[branch_id]):
            attempts = attempts_by_step.get(step_id, ())
            for i, a in enumerate(attempts):
                if a.status == AttemptStatus.DISPATCHED:
                    out.append(OpenIntent(
                        run_id=state.run_id, branch_id=branch_id, origin_branch_id=origin_branch(state, branch_id, a),
                        step_id=a.step_id, attempt=a.attempt, executor_id=a.executor_id,
                        dispatched_lsn=a.dispatched_lsn, superseded=i < len(attempts) - 1,
                    ))
    return out


def executors_to_check(state: RunState, intents: Iterable[OpenIntent]) -> set[ExecutorId]:
    """Executor ids whose liveness :func:`triage` needs (intent writers and the run's owner)."""
    ids = {i.executor_id for i in intents}
    if state.executor_id is not None:
        ids.add(state.executor_id)
    return ids


def settled(state: RunState, intent: OpenIntent) -> bool:
    """No executor will supersede ``intent``: superseded, on an inactive branch, or the run rests."""
    return intent.superseded or intent.branch_id != state.active_branch or state.status in RESTING


def origin_record(state: RunState, intent: OpenIntent) -> AttemptState | None:
    """The ancestor's own record of an inherited intent (``None`` if not inherited)."""
    if not intent.inherited:
        return None
    for a in state.branches[intent.origin_branch_id].attempts.get(intent.step_id, ()):
        if a.attempt == intent.attempt:
            return a
    return None


def triage(state: RunState, live_executors: Set[str]) -> Triage:
    """Decide, from the folded state and which executors hold a lease, what recovery does.

    Args:
        live_executors: executor ids with a live lease entry (at least those of
            :func:`executors_to_check`; others are ignored).
    """
    resolve: list[OpenIntent] = []
    waiting: list[Waiting] = []
    resume = False
    owner_alive = state.executor_id is not None and state.executor_id in live_executors
    for intent in open_intents(state):
        writer_gone = intent.executor_id not in live_executors
        if settled(state, intent):
            origin = origin_record(state, intent)
            if writer_gone or (origin is not None and origin.status != AttemptStatus.DISPATCHED):
                resolve.append(intent)
            else:
                waiting.append(Waiting(intent=intent, reason="executor_alive"))
        elif (writer_gone or intent.inherited) and not owner_alive:
            resume = True
            waiting.append(Waiting(intent=intent, reason="latest_attempt"))
        else:
            reason: WaitReason = "owner_alive" if writer_gone or intent.inherited else "executor_alive"
            waiting.append(Waiting(intent=intent, reason=reason))
    return Triage(resolve=tuple(resolve), resume=resume, waiting=tuple(waiting))


def resolution_events(
    state: RunState, intents: Iterable[OpenIntent], markers: Mapping[str, BlobRef], *, at_ms: int,
    lost_message: str = LOST_MESSAGE,
) -> tuple[AnyEvent, ...]:
    """The outcome events resolving ``intents`` (one commit), ``recovered=True``.

    Args:
        markers: outcome markers found, by :attr:`OpenIntent.marker_key`; a
            missing key means the executor never stored an output.
        at_ms: the resolution time (epoch ms).
        lost_message: the ``attempt_failed`` message of an intent without a marker (``{executor_id}``: its writer).
    """
    events: list[AnyEvent] = []
    for intent in intents:
        origin = origin_record(state, intent)
        ref = markers.get(intent.marker_key)
        event: AttemptSucceeded | AttemptFailed
        if origin is not None and origin.status != AttemptStatus.DISPATCHED:
            event = _copy_outcome(intent, origin, at_ms)
        elif ref is not None:
            event = AttemptSucceeded.from_marker(intent.branch_id, intent.step_id, intent.attempt, ref, at_ms)
        else:
            event = AttemptFailed(
                branch_id=intent.branch_id, step_id=intent.step_id, attempt=intent.attempt,
                error_kind=EXECUTOR_LOST, retryable=True, at_ms=at_ms, recovered=True,
                message=lost_message.format(executor_id=intent.executor_id),
            )
        events.append(as_cancelled(state, event) if caught(state, intent.branch_id) else event)
    return tuple(events)


def _copy_outcome(intent: OpenIntent, origin: AttemptState, at_ms: int) -> AttemptSucceeded | AttemptFailed:
    if origin.status == AttemptStatus.SUCCEEDED and origin.output_ref is not None:
        return AttemptSucceeded(branch_id=intent.branch_id, step_id=intent.step_id, attempt=intent.attempt,
                                output_ref=origin.output_ref, usage=origin.usage, at_ms=at_ms, recovered=True)
    return AttemptFailed(
        branch_id=intent.branch_id, step_id=intent.step_id, attempt=intent.attempt,
        error_kind=origin.error_kind or EXECUTOR_LOST, message=origin.error_message or "",
        retryable=origin.retryable, usage=origin.usage, at_ms=at_ms, recovered=True,
    )


ABANDONED = ("executor {executor_id} abandoned it: the drive that dispatched it ended without an outcome; "
             "no output was stored")
"""The ``attempt_failed`` message of an intent its live executor abandoned (:func:`abandon`)."""


def own_settled(state: RunState, executor_id: str) -> tuple[OpenIntent, ...]:
    """The open intents ``executor_id`` dispatched that are :func:`settled` (superseded, on an inactive branch,
    or in a resting run): no drive of it will ever record them once it holds none of them in flight. Pure.

    An inherited copy on a fork is not among them: it is recovery's to resolve, from its origin's outcome
    once that is recorded (its origin, on the branch it was dispatched on, is)."""
    return tuple(i for i in open_intents(state)
                 if i.executor_id == executor_id and not i.inherited and settled(state, i))


def abandon(state: RunState, executor_id: str, markers: Mapping[str, BlobRef | None], *,
            at_ms: int) -> Decision:
    """The events (or ``Skip("nothing to abandon")``) by which ``executor_id`` resolves its own settled open
    intents (:func:`own_settled`) when it holds none of them in a drive — as recovery would once its lease
    is gone (:func:`resolution_events`, ``recovered=True``): the stored output if its marker was
    found, else ``attempt_failed`` ``executor_lost``.

    Args:
        markers: the markers looked up, by :attr:`OpenIntent.marker_key` (``None``: none stored); an intent
            whose marker was not looked up is left for a later call (never resolved on a guess).
        at_ms: the resolution time (epoch ms).
    """
    intents = [i for i in own_settled(state, executor_id) if i.marker_key in markers]
    found = {key: ref for key, ref in markers.items() if ref is not None}
    return events_or_skip(resolution_events(state, intents, found, at_ms=at_ms, lost_message=ABANDONED),
                          "nothing to abandon")


def outcome_of(event: AnyEvent) -> AttemptStatus:
    """``succeeded``, ``failed`` or ``cancelled`` for a resolution event (for replies and logs)."""
    if isinstance(event, AttemptCancelled):
        return AttemptStatus.CANCELLED
    return AttemptStatus.SUCCEEDED if isinstance(event, AttemptSucceeded) else AttemptStatus.FAILED


def plan(state: RunState, *, dead: Set[ExecutorId], markers: Mapping[str, BlobRef | None]) -> Triage:
    """The triage of ``state`` given what recovery looked up outside the log (pure; :func:`decide`'s plan).

    Args:
        dead: executors looked up and found without a lease.
        markers: the outcome markers looked up (every open intent of a ``dead`` executor), by
            :attr:`OpenIntent.marker_key`; ``None``: the executor stored none.

    Every other executor is presumed live — one first seen in ``state`` (the state moved on
    since the look-ups), and a dead one with an intent whose marker was not looked up: recovery
    never guesses, a later pass looks them up.
    """
    intents = open_intents(state)
    unchecked = {i.executor_id for i in intents if i.executor_id in dead and i.marker_key not in markers}
    live = executors_to_check(state, intents) - (set(dead) - unchecked)
    return triage(state, live)


def decide(state: RunState, *, dead: Set[ExecutorId], markers: Mapping[str, BlobRef | None], at_ms: int
           ) -> Decision:
    """What recovery commits on ``state``: the events resolving ``plan(...).resolve`` in its order (pure), or
    ``Skip("nothing to resolve")``. ``at_ms``: the resolution time (epoch ms); the rest as :func:`plan`."""
    found = {key: ref for key, ref in markers.items() if ref is not None}
    resolve = plan(state, dead=dead, markers=markers).resolve
    return events_or_skip(resolution_events(state, resolve, found, at_ms=at_ms), "nothing to resolve")
