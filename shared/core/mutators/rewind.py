"""Rewind's pure core: validate a :class:`~reel.shared.core.wire.commands.RewindRun` and decide the fork.

The rewind service (services/rewind) reads one run's commits, folds them and
asks :func:`decide` what to do; it commits and publishes, nothing else. No clock,
I/O or randomness here: the time and the candidate branch id come in as
arguments.

Where a branch may be forked:

* ``at_lsn`` must be one of the run's commit LSNs on the branch's *lineage*
  (:func:`lineage_lsns`): the branch's own commits (:func:`commit_branches`), after
  the parent's lineage up to the fork LSN for a forked branch. An LSN of another
  run, an LSN beyond the head, an LSN between a branch's fork point and its
  creation, or a commit of another branch (a sibling's, a child's) is refused.
* ``at_step`` forks just before the step's first attempt on that branch (the
  previous lineage LSN) — or *at* the commit of that attempt's intent when that
  commit also holds the outcome of the step before it (one round trip per step:
  an outcome and the next intent share a commit) — or at the head if the step never ran there, with ``from_step``
  set so the new branch keeps only the steps before it. An agent
  step forks before its first turn. A turn or tool call (``solve:t2``,
  ``solve:t1:c1``) forks *at* the commit that declared it: that commit may also
  hold the outcome of the step before it (the last tool result of turn 1 and turn
  2's intent share one commit), and ``from_step`` excludes the declared step
  itself. A turn or call never declared on the branch is refused.

After a fork the service asks an executor to resume the run unless its live
owner is still driving it (:func:`needs_resume`).

Idempotency: the new branch id is derived from the command's idempotency key
(the service derives one from the command message when the client gave none),
so a repeated rewind finds its branch already in the state and gets it back
(:data:`BRANCH_EXISTS`: a Skip, the branch is ``state.branches[branch_id]``) without a new commit.
Reusing a key with different explicit parameters is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.decision import Decision, Skip
from reel.shared.core.errors import InvalidCommand, InvalidTransition
from reel.shared.core.mutators import forking
from reel.shared.core.run.events import BranchForked, Commit, RunCreated, VerdictRecorded
from reel.shared.core.run.ids import LSN, BranchId, StepId
from reel.shared.core.run.state import DRIVABLE, BranchState, RunState, RunStatus
from reel.shared.core.run.stepids import parse_step_id
from reel.shared.core.wire.commands import RewindRun


class BranchNotFound(InvalidCommand):
    """The rewind names a branch the run does not have."""

    code = "branch_not_found"


class StepNotFound(InvalidCommand):
    """The rewind names a step that is not in the run's workflow."""

    code = "step_not_found"


class LsnNotInLineage(InvalidCommand):
    """``at_lsn`` is not a commit of this run on that branch's lineage (or beyond its head)."""

    code = "lsn_not_in_lineage"


class IdempotencyKeyReused(InvalidCommand):
    """The idempotency key already made a branch with other parameters."""

    code = "idempotency_key_reused"


BRANCH_EXISTS = Skip("branch exists")
"""The decision on a repeated rewind: the idempotency key's branch exists already (answer with it)."""


def needs_resume(state: RunState, owner_alive: bool) -> bool:
    """Whether to publish ``ResumeRun`` for a run just forked from ``state`` (its pre-fork state).

    A run that is ``pending``/``running`` with a live owner is being driven: the
    owner's next fenced commit conflicts with the fork, it re-reads and goes on on
    the new branch by itself. A resume would start a *second* drive loop on the
    same run in that executor, and two loops with one executor id supersede each
    other's in-flight attempts. Anything else (resting, or an owner that is gone)
    needs an executor to pick the run up.
    """
    driven = state.status in DRIVABLE and state.executor_id is not None and owner_alive
    return not driven


def commit_branches(commits: Iterable[tuple[int, Commit]]) -> list[tuple[int, frozenset[BranchId]]]:
    """The branches each commit belongs to, in order: ``[(lsn, branches), …]``.

    A commit belongs to every branch its events name (``run_created`` and ``branch_forked``:
    the branch they create; a verdict: the branch it judged; an attempt, ``run_verifying``, an
    agent's declarations: their branch); a commit naming none (``run_started``, ``run_completed``,
    ``run_cancelled``) belongs to the branch active when it was committed.

    Args:
        commits: every ``(lsn, commit)`` of the run, ascending (e.g. from ``EventLog.read``).
    """
    active: BranchId | None = None
    out: list[tuple[int, frozenset[BranchId]]] = []
    for lsn, commit in commits:
        named: set[BranchId] = set()
        for e in commit.events:
            if isinstance(e, VerdictRecorded):
                named.add(e.verdict.branch_id)
                continue
            branch = getattr(e, "branch_id", None)
            if branch is not None:
                named.add(branch)
            if isinstance(e, RunCreated | BranchForked):
                active = e.branch_id
        out.append((lsn, frozenset(named) if named or active is None else frozenset((active,))))
    return out


def lineage_lsns(state: RunState, commits: Sequence[tuple[int, Commit]], branch_id: BranchId) -> list[int]:
    """The run's commit LSNs a fork of ``branch_id`` may start from, ascending: the parent's lineage up
    to the fork LSN (a forked branch), then the branch's own commits (:func:`commit_branches`).

    Args:
        commits: every ``(lsn, commit)`` of the run, ascending.

    Raises:
        KeyError: unknown branch.
    """
    return _lineage(state, commit_branches(commits), branch_id)


def _lineage(state: RunState, owned: Sequence[tuple[int, frozenset[BranchId]]], branch_id: BranchId) -> list[int]:
    branch = state.branches[branch_id]
    own = [lsn for lsn, names in owned if branch_id in names and lsn >= branch.created_lsn]
    if branch.parent_branch_id is None or branch.fork_lsn is None:
        return own
    inherited = [lsn for lsn in _lineage(state, owned, branch.parent_branch_id) if lsn <= branch.fork_lsn]
    return inherited + own


def decide(state: RunState, commits: Sequence[tuple[int, Commit]], cmd: RewindRun, *, branch_id: BranchId,
           at_ms: int) -> Decision:
    """What a rewind command does to ``state``: ``(branch_forked,)`` (commit it, then ask an executor to
    resume the run), or :data:`BRANCH_EXISTS` (``branch_id`` is in ``state.branches``; commit nothing).

    Args:
        state: the run folded at its head (``state.head_lsn`` must be the last commit's LSN).
        commits: every ``(lsn, commit)`` of the run, ascending.
        cmd: the decoded command (``cmd.run_id`` is ``state.run_id``).
        branch_id: the id the new branch gets (derived from the idempotency key).
        at_ms: the fork's time (epoch ms).

    Raises:
        InvalidCommand: neither or both of ``at_step``/``at_lsn``.
        BranchNotFound, StepNotFound, LsnNotInLineage: the fork point does not exist.
        IdempotencyKeyReused: ``branch_id`` exists with other explicit parameters.
        InvalidEdit: ``cmd.edits`` do not fit the turn they edit
            (:func:`reel.shared.core.mutators.forking.check_edits`).
        InvalidTransition: the run is cancelled.
    """
    if (cmd.at_step is None) == (cmd.at_lsn is None):
        raise InvalidCommand("rewind needs exactly one of `at_step` or `at_lsn`", run_id=state.run_id)
    existing = state.branches.get(branch_id)
    if existing is not None:
        _check_same_request(state, existing, cmd)
        return BRANCH_EXISTS
    if state.status == RunStatus.CANCELLED:
        raise InvalidTransition(f"run {state.run_id} is cancelled; a cancelled run cannot be rewound",
                                run_id=state.run_id)
    parent = cmd.branch or state.active_branch
    if parent not in state.branches:
        raise BranchNotFound(f"run {state.run_id} has no branch {parent!r} (branches: "
                             f"{', '.join(sorted(state.branches))})", run_id=state.run_id)
    owned = commit_branches(commits)
    lineage = _lineage(state, owned, parent)
    if cmd.at_lsn is not None:
        _check_lsn(state, lineage, owned, parent, cmd.at_lsn)
        fork_lsn, from_step = cmd.at_lsn, None
    else:
        assert cmd.at_step is not None
        fork_lsn, from_step = _step_fork_lsn(state, lineage, parent, cmd.at_step), cmd.at_step
    if cmd.edits:
        forking.check_edits(state.run_id, state.branches[parent], from_step, cmd.edits)
    return (BranchForked(branch_id=branch_id, parent_branch_id=parent, fork_lsn=fork_lsn, from_step=from_step,
                         at_ms=at_ms, by=cmd.by, edits=cmd.edits or msgspec.UNSET),)


def _check_lsn(state: RunState, lineage: Sequence[int], owned: Sequence[tuple[int, frozenset[BranchId]]],
               branch_id: BranchId, lsn: int) -> None:
    if lsn > state.head_lsn:
        raise LsnNotInLineage(f"lsn {lsn} is beyond the head of run {state.run_id} (head lsn {state.head_lsn})",
                              run_id=state.run_id)
    if lsn not in lineage:
        owners = next((sorted(names) for at, names in owned if at == lsn), None)
        if lsn < state.created_lsn:
            why = f"it is before the run's first commit (lsn {state.created_lsn})"
        elif owners:
            why = (f"it is a commit of branch {', '.join(map(repr, owners))}, not on the lineage of branch "
                   f"{branch_id!r}")
        else:
            why = f"it is not a commit of this run on the lineage of branch {branch_id!r}"
        raise LsnNotInLineage(f"lsn {lsn} cannot be a fork point of run {state.run_id}: {why}", run_id=state.run_id)


def _step_fork_lsn(state: RunState, lineage: Sequence[int], branch_id: BranchId, step_id: StepId) -> LSN:
    if not turnfold.is_fork_point(state, step_id):
        raise StepNotFound(f"run {state.run_id} has no step {step_id!r} (steps: "
                           f"{', '.join(d.step_id for d in state.steps)})", run_id=state.run_id)
    branch = state.branches[branch_id]
    if parse_step_id(step_id) is not None:
        entry = turnfold.entry(branch, step_id)
        if entry is None:
            raise StepNotFound(f"run {state.run_id} has no step {step_id!r} on branch {branch_id!r} (an agent's turns"
                               " and calls exist once declared)", run_id=state.run_id)
        return entry.lsn
    rec = turnfold.record(branch, step_id)
    attempts = branch.attempts.get(step_id)
    if rec is not None and rec.turns:
        first = rec.turns[0].lsn
    elif not attempts:
        return LSN(lineage[-1])
    else:
        first = attempts[0].dispatched_lsn
        if _records_an_earlier_outcome(state, branch, step_id, first):
            return first  # one round trip per step: the commit of its first intent closed the step before it
    before = [lsn for lsn in lineage if lsn < first]
    return LSN(before[-1]) if before else state.created_lsn


def _records_an_earlier_outcome(state: RunState, branch: BranchState, step_id: StepId, lsn: LSN) -> bool:
    """True if the commit at ``lsn`` also holds the outcome of a step before ``step_id`` (an
    outcome and the next intent share a commit). Forking at that commit keeps the outcome: what the
    new branch inherits stops before ``step_id`` by step (:func:`reel.shared.core.run.state.inherited`)."""
    earlier = state.steps[:state.step_index(step_id)]
    return any(a.outcome_lsn == lsn for d in earlier for a in branch.attempts.get(d.step_id, ()))


def _check_same_request(state: RunState, existing: BranchState, cmd: RewindRun) -> None:
    """A repeated key must not name a different fork point (fields left unset are not compared)."""
    clashes = []
    if cmd.branch is not None and cmd.branch != existing.parent_branch_id:
        clashes.append(f"branch {cmd.branch!r} != {existing.parent_branch_id!r}")
    if cmd.at_step is not None and cmd.at_step != existing.from_step:
        clashes.append(f"at_step {cmd.at_step!r} != {existing.from_step!r}")
    if cmd.at_lsn is not None and (existing.from_step is not None or cmd.at_lsn != existing.fork_lsn):
        clashes.append(f"at_lsn {cmd.at_lsn} != fork lsn {existing.fork_lsn} (from_step {existing.from_step!r})")
    own = next((e.edits for e in existing.edits if e.own), ()) if isinstance(existing.edits, tuple) else ()
    if cmd.edits and tuple(cmd.edits) != own:
        clashes.append("other edits")
    if existing.parent_branch_id is None:
        clashes.append("the key names the run's root branch")
    if clashes:
        raise IdempotencyKeyReused(
            f"idempotency key already forked branch {existing.branch_id} of run {state.run_id} with other "
            f"parameters: {'; '.join(clashes)}", run_id=state.run_id)
