"""What a run's page shows: pure functions of a folded :class:`RunState` (no I/O).

:func:`run_page` builds, for one branch, the timeline (each step and agent turn or tool
call with every attempt — failed, superseded, cancelled — its LSNs, usage, partition,
prompt/output refs, a call's arguments and input request) from
:func:`~reel.shared.core.run.views.build_episode_view`, and :func:`lineage`, the branch graph as
lanes on an LSN axis (what the page draws as inline SVG).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from reel.shared.application.workspace import FileChange
from reel.shared.core.agent import turnfold
from reel.shared.core.input.requeststate import InputRecord
from reel.shared.core.run import budget, timers
from reel.shared.core.run.events import BlobRef, ContextPartition, StepHalted, Verdict
from reel.shared.core.run.ids import BranchId
from reel.shared.core.run.integrity import Corruption
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView, build_episode_view
from reel.shared.core.verify.verification import context_checks, reported_outcome

PARTITION_GROUPS = ("packed", "available", "dropped")
DROP_REASONS = {
    "excluded_kind": "its kind is excluded by the step's policy (exclude_kinds)",
    "stale": "marked stale by its producer, and the policy drops stale items (drop_stale)",
    "duplicate": "the same text as an earlier eligible item (dedupe)",
    "over_item_cap": "more tokens than the policy's max_item_tokens",
    "over_budget": "alone (or with its group) larger than the whole budget",
    "group_dropped": "another item of its group (its turn) was dropped, so the whole group was",
}
"""What each drop reason the packer records means (docs/context.md): the title of a dropped item's reason."""
LANE_H, LANE_PAD, AXIS_W, LABEL_W = 34, 22, 720, 200
"""Lineage graph geometry (SVG user units): lane height, top padding, LSN axis width, label column."""


@dataclass(frozen=True)
class PartitionItem:
    """One context item of a partition.

    Attributes:
        tokens: its tokens as the packer counted them (``None``: not recorded, an older partition).
        reason: why it is where it is: a dropped item's drop reason (``stale``, ``over_budget``…); an available
            item's shortfall (``needs 120 > 80 left``, or ``with its group > 80 left`` for a member of a turn's
            group too large for what was left); ``""`` for a packed item or when not recorded.
        trimmed: its text was cut to its head and tail before packing.
    """

    item_id: str
    tokens: int | None = None
    reason: str = ""
    trimmed: bool = False


@dataclass(frozen=True)
class Change:
    """One item that differs from the partition a collapsed one is shown against: ``was`` and ``now`` are its
    groups there and here (``None``: not a candidate there / here); same groups: its tokens or reason changed."""

    item: PartitionItem
    was: str | None
    now: str | None

    @property
    def label(self) -> str:
        """``new in packed``, ``packed → available``, ``gone from available``, ``changed in dropped``."""
        if self.was is None:
            return f"new in {self.now}"
        if self.now is None:
            return f"gone from {self.was}"
        return f"changed in {self.now}" if self.was == self.now else f"{self.was} → {self.now}"


@dataclass(frozen=True)
class Collapsed:
    """A partition shown as "same as <label> except <changes>": ``anchor`` is the earlier attempt's element id
    (:func:`attempt_anchor`), ``label`` how the page names it (an agent's ``turn 3``, ``turn 3 #2``; a model
    step's ``plan #1``), ``changes`` in the order packed, available, dropped, then the items gone."""

    anchor: str
    label: str
    changes: tuple[Change, ...]

    def sections(self) -> tuple[tuple[Change, tuple[PartitionItem, ...]], ...]:
        """The changes by kind (:attr:`Change.label`), in order of first appearance: ``(first change, items)``."""
        by: dict[str, list[Change]] = {}
        for c in self.changes:
            by.setdefault(c.label, []).append(c)
        return tuple((cs[0], tuple(c.item for c in cs)) for cs in by.values())


@dataclass(frozen=True)
class Partition:
    """A model attempt's partition: items by group (``packed``, ``available``, ``dropped``) and its token
    accounting (tokens; ``None`` where the partition did not record it): the whole ``budget_tokens``, the
    ``reserved_tokens`` counted first (tool schemas, instructions), ``packed_tokens``, by ``tokenizer``."""

    groups: tuple[tuple[str, tuple[PartitionItem, ...]], ...]
    budget_tokens: int | None = None
    reserved_tokens: int | None = None
    packed_tokens: int | None = None
    tokenizer: str = ""
    same_as: Collapsed | None = None

    @property
    def size(self) -> int:
        """How many items (candidates) the partition has."""
        return sum(len(items) for _, items in self.groups)

    def count(self, group: str) -> int:
        """How many items ``group`` holds."""
        return len(dict(self.groups)[group])

    @property
    def left_tokens(self) -> int | None:
        """What the budget had left after the reserved and packed tokens (≥ 0), ``None`` if not recorded."""
        if self.budget_tokens is None or self.packed_tokens is None:
            return None
        return max(0, self.budget_tokens - (self.reserved_tokens or 0) - self.packed_tokens)

    def group_tokens(self, group: str) -> int | None:
        """The token total of a group's items, ``None`` unless every item's tokens were recorded."""
        items = dict(self.groups)[group]
        return sum(i.tokens for i in items) if all(i.tokens is not None for i in items) else None  # type: ignore[misc]

    def bar(self) -> tuple[tuple[str, float], ...]:
        """The budget bar: ``(part, percent of the budget)`` for ``reserved``, ``packed``, ``left`` (over
        100 % in all when required items alone exceed the budget: then scaled to the total); empty without a
        budget."""
        if not self.budget_tokens or self.packed_tokens is None:
            return ()
        parts = (("reserved", self.reserved_tokens or 0), ("packed", self.packed_tokens),
                 ("left", self.left_tokens or 0))
        total = max(self.budget_tokens, sum(n for _, n in parts))
        return tuple((k, round(100 * n / total, 2)) for k, n in parts)


@dataclass(frozen=True)
class AttemptEntry:
    """One attempt on the timeline: the view and its usage fields (its bar is placed by CSS from its LSNs)."""

    view: AttemptView
    usage: tuple[tuple[str, Any], ...]
    partition: Partition | None
    started_ms: int = 0
    finished_ms: int | None = None
    workspace: tuple[FileChange, ...] | str | None = None
    """What the attempt changed in its branch's workspace (``None``: it recorded no snapshot — no workspace, or
    the files were left as they were; a ``str``: why the change cannot be shown)."""


WorkspaceChanges = Mapping[tuple[str, int], tuple[FileChange, ...] | str]
"""Per ``(step id, attempt)``: the files that attempt changed, or why they cannot be shown."""


@dataclass(frozen=True)
class StepEntry:
    """One step (or an agent's turn or tool call) on the timeline.

    Attributes:
        depth: 1 for an agent's turns and calls, else 0.
        arguments, arguments_ref: a tool call's raw JSON arguments, inline or by blob.
        started_ms, finished_ms: from its first attempt's dispatch to its last attempt's outcome (an agent step:
            over its turns and calls; Unix ms; 0 / ``None``: not started / not finished).
    """

    view: StepView
    depth: int
    label: str
    attempts: tuple[AttemptEntry, ...]
    arguments: str | None = None
    arguments_ref: BlobRef | None = None
    call_id: str = ""
    is_error: bool = False
    input: InputRecord | None = None
    output_ref: BlobRef | None = None
    error_kind: str | None = None
    started_ms: int = 0
    finished_ms: int | None = None


@dataclass(frozen=True)
class Lane:
    """One branch of the lineage graph: its lane's y, its span on the LSN axis (x0–x1) and the fork curve's start
    (fx, fy) on the parent's lane, if forked; ``marks`` are its verdicts ``(x, status, text)``."""

    branch_id: str
    parent: str | None
    fork_lsn: int | None
    from_step: str | None
    first_lsn: int
    last_lsn: int
    y: float
    x0: float
    x1: float
    fx: float | None = None
    fy: float | None = None
    active: bool = False
    shown: bool = False
    marks: tuple[tuple[float, str, str], ...] = ()


@dataclass(frozen=True)
class Lineage:
    """The branch graph: SVG size (user units), the LSN range drawn and one lane per branch (root first)."""

    width: int
    height: int
    lo: int
    hi: int
    lanes: tuple[Lane, ...]


@dataclass(frozen=True)
class Failure:
    """Why a run failed, for the top of its page.

    Attributes:
        step_id, attempt: the first step (workflow order) that failed for good on the branch shown, and its last
            failed attempt (``None``: the step failed without one, e.g. an agent step's turn limit); ``""`` /
            ``None`` when only verdicts failed.
        error: that attempt's ``kind: message`` (or the step's error kind), ``""`` if none.
        anchor: the element id the "jump" link goes to (:func:`attempt_anchor`, :func:`step_anchor`, else
            ``verdicts``).
        verdicts: the verdicts on that branch that did not pass (the latest per verifier).
    """

    step_id: str
    attempt: int | None
    error: str
    anchor: str
    verdicts: tuple[Verdict, ...] = ()


def step_anchor(step_id: str) -> str:
    """The element id of a step on the run page: ``step-<step id>``."""
    return f"step-{step_id}"


def attempt_anchor(step_id: str, attempt: int) -> str:
    """The element id of an attempt on the run page: ``attempt-<step id>-<attempt no>``."""
    return f"attempt-{step_id}-{attempt}"


@dataclass(frozen=True)
class RunPage:
    """Everything the run page renders for ``branch_id``.

    Attributes:
        outcome: the reported outcome (:func:`reel.shared.core.verify.verification.reported_outcome`), ``""`` until
        completed.
        checks: the names of the run's context checks (verifiers reported beside the outcome, not as it).
        budget: the run's spend against its budget (:func:`reel.shared.core.run.budget.summary`; ``""``: none).
        halt: the end reason of the branch shown when a ``step_halted`` ended it (``budget_exhausted: …``).
        wakes: a sleeping run's wake time (ISO-8601 UTC) and the step it sleeps in; ``""`` unless it sleeps.
    """

    state: RunState
    branch_id: str
    view: EpisodeView
    steps: tuple[StepEntry, ...]
    lineage: Lineage
    verdicts: tuple[Verdict, ...]
    corrupt: Corruption | None = None
    usage: tuple[tuple[str, Any], ...] = field(default=())
    usage_by_source: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = field(default=())
    outcome: str = ""
    checks: tuple[str, ...] = ()
    failure: Failure | None = None
    budget: str = ""
    halt: str = ""
    wakes: str = ""  # a sleeping run's wake time (ISO-8601 UTC) and the step it sleeps in; "" otherwise


def failure(steps: tuple[StepEntry, ...], verdicts: tuple[Verdict, ...], branch_id: str, outcome: str,
            checks: tuple[str, ...] = ()) -> Failure | None:
    """What the run page's failure summary shows: the first step that failed for good and its last failed
    attempt, and the branch's verdicts that did not pass (context checks ``checks`` aside: they are reported
    beside the outcome); ``None`` if no step failed, no verdict failed and ``outcome`` is not ``failed`` or
    ``error``."""
    latest: dict[str, Verdict] = {}
    for v in verdicts:
        if v.branch_id == branch_id and v.verifier not in checks:
            latest[v.verifier] = v
    bad = tuple(v for v in latest.values() if str(v.status) != "pass")
    step = next((s for s in steps if str(s.view.status) == "failed"), None)
    if step is None:
        if outcome not in ("failed", "error") and not bad:
            return None
        if not bad:
            return Failure(step_id="", attempt=None, error="", anchor="verdicts")
        v = bad[0]
        anchor = (attempt_anchor(v.step_id, v.attempt) if v.step_id and v.attempt else
                  step_anchor(v.step_id) if v.step_id else "verdicts")
        return Failure(step_id=v.step_id or "", attempt=v.attempt, error="", anchor=anchor, verdicts=bad)
    failed = [e.view for e in step.attempts if str(e.view.status) == "failed"]
    if failed:
        a = failed[-1]
        return Failure(step_id=str(step.view.step_id), attempt=int(a.attempt),
                       error=f"{a.error_kind or 'failed'}: {a.error_message or ''}".rstrip(": "),
                       anchor=attempt_anchor(str(step.view.step_id), int(a.attempt)), verdicts=bad)
    return Failure(step_id=str(step.view.step_id), attempt=None, error=step.error_kind or "",
                   anchor=step_anchor(str(step.view.step_id)), verdicts=bad)


def partition(context: ContextPartition) -> Partition:
    """The partition's items by group with their tokens and reasons, and its token accounting (docs/context.md).

    Item tokens come from ``item_tokens`` (packed, then available, then dropped); a dropped item's reason from
    ``drop_reasons``; an available item's reason says what it needed against what the budget had left (an
    item that alone would have fit was left out with its turn's group). Fields a partition did not record
    (older logs) are left out, never guessed.
    """
    n = len(context.packed) + len(context.available) + len(context.dropped)
    tokens: tuple[int | None, ...] = (tuple(context.item_tokens) if isinstance(context.item_tokens, tuple)
                                      and len(context.item_tokens) == n else (None,) * n)
    reasons = dict(context.dropped_with_reasons())
    trimmed = set(context.trimmed) if isinstance(context.trimmed, tuple) else set()
    part = Partition(groups=(), budget_tokens=_int(context.budget_tokens), reserved_tokens=_int(
        context.reserved_tokens), packed_tokens=_int(context.packed_tokens),
        tokenizer=context.tokenizer if isinstance(context.tokenizer, str) else "")
    left = part.left_tokens
    groups: list[tuple[str, tuple[PartitionItem, ...]]] = []
    at = 0
    for g in PARTITION_GROUPS:
        items = []
        for item in getattr(context, g):
            t = tokens[at]
            at += 1
            why = reasons.get(item, "") if g == "dropped" else ""
            if g == "available" and t is not None and left is not None:
                why = f"needs {t} > {left} left" if t > left else f"with its group > {left} left"
            items.append(PartitionItem(item_id=str(item), tokens=t, reason=why, trimmed=item in trimmed))
        groups.append((g, tuple(items)))
    return dataclasses.replace(part, groups=tuple(groups))


def collapse(part: Partition, base: Partition, anchor: str, label: str) -> Partition:
    """``part`` shown against ``base`` (the partition of an earlier attempt the page shows in full or collapsed):
    ``part`` with :attr:`Partition.same_as` set when its items differ from ``base``'s in at most half of them
    (group, tokens, drop reason or trim mark; an available item's shortfall follows the budget line and is
    not compared) and the items both hold are in the same order in each group; else ``part`` unchanged."""
    before = {i.item_id: (g, i) for g, items in base.groups for i in items}
    after = {i.item_id: (g, i) for g, items in part.groups for i in items}
    changes: list[Change] = []
    for g, items in part.groups:
        for i in items:
            old = before.get(i.item_id)
            if old is None or old[0] != g or _key(old[1], g) != _key(i, g):
                changes.append(Change(item=i, was=old[0] if old else None, now=g))
    changes += [Change(item=i, was=g, now=None) for g, items in base.groups for i in items if i.item_id not in after]
    if 2 * len(changes) > max(part.size, 1):
        return part
    for g, items in part.groups:  # the same order where both hold an item in the same group
        mine = [i.item_id for i in items if before.get(i.item_id, ("",))[0] == g]
        theirs = [i.item_id for i in dict(base.groups).get(g, ()) if after.get(i.item_id, ("",))[0] == g]
        if mine != theirs:
            return part
    return dataclasses.replace(part, same_as=Collapsed(anchor=anchor, label=label, changes=tuple(changes)))


def attempt_partition(state: RunState, branch_id: str, step_id: str, attempt: int) -> Partition | None:
    """The partition of attempt ``attempt`` of ``step_id`` on ``branch_id``, in full; ``None`` if that attempt
    is not on the branch's timeline or recorded none.

    Raises:
        KeyError: no such branch.
    """
    view = build_episode_view(state, BranchId(branch_id))
    for s in view.steps:
        if s.step_id == step_id:
            for a in s.attempts:
                if a.attempt == attempt and a.context is not None:
                    return partition(a.context)
    return None


def _key(item: PartitionItem, group: str) -> tuple[int | None, str, bool]:
    return item.tokens, item.reason if group == "dropped" else "", item.trimmed


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _usage(usage: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(msgspec.to_builtins(usage).items())


def run_page(state: RunState, branch_id: str | None = None, *, corrupt: Corruption | None = None,
             collapse_partitions: bool = True, workspace: WorkspaceChanges | None = None) -> RunPage:
    """The run page of ``branch_id`` (default: the active branch).

    ``workspace`` holds each tool call's file changes (read from the blob store by the caller:
    :func:`reel.shared.application.workspace.call_diff`), shown under its attempt.

    With ``collapse_partitions``, a model attempt's partition is shown against the one before it in the same
    scope (an agent's turns, or the attempts of one model step) when little changed (:func:`collapse`): the
    page then grows with the turns, not with their square.

    Raises:
        KeyError: no such branch.
    """
    bid = BranchId(branch_id) if branch_id else state.active_branch
    branch = state.branches[bid]
    view = build_episode_view(state, bid)
    steps = []
    last: dict[str, tuple[Partition, str, str]] = {}  # scope → (partition, anchor, label) of its latest attempt
    for s in view.steps:
        entries = []
        scope = s.parent_step if isinstance(s.parent_step, str) else s.step_id
        times = {int(x.attempt): x for x in branch.attempts.get(s.step_id, ())}
        for a in s.attempts:
            at = times.get(int(a.attempt))
            part = partition(a.context) if a.context is not None else None
            if part is not None:
                anchor = attempt_anchor(a.step_id, a.attempt)
                label = (f"turn {s.turn}" + (f" #{a.attempt}" if a.attempt > 1 else "")
                         if isinstance(s.turn, int) and s.parent_step == scope else f"{s.step_id} #{a.attempt}")
                prev = last.get(scope)
                last[scope] = (part, anchor, label)
                if collapse_partitions and prev is not None:
                    part = collapse(part, *prev)
            entries.append(AttemptEntry(
                view=a, usage=_usage(a.usage), partition=part,
                started_ms=at.dispatched_ms if at is not None else 0,
                finished_ms=at.finished_ms if at is not None and a.outcome_lsn is not None else None,
                workspace=(workspace or {}).get((str(a.step_id), int(a.attempt)))))
        decl = turnfold.declared(branch, s.step_id) if isinstance(s.parent_step, str) else None
        steps.append(StepEntry(
            view=s, depth=1 if isinstance(s.parent_step, str) else 0, label=_label(s), attempts=tuple(entries),
            arguments=decl.arguments if decl else None, arguments_ref=decl.arguments_ref if decl else None,
            call_id=s.call_id if isinstance(s.call_id, str) else "", is_error=s.is_error is True,
            input=s.input if isinstance(s.input, InputRecord) else None,
            output_ref=s.output_ref if isinstance(s.output_ref, BlobRef) else None,
            error_kind=s.error_kind if isinstance(s.error_kind, str) else None,
            started_ms=entries[0].started_ms if entries else 0,
            finished_ms=entries[-1].finished_ms if entries and str(s.status) in _ENDED else None))
    steps = _agent_spans(steps)
    outcome, checks = reported_outcome(state) or "", context_checks(state)
    return RunPage(state=state, branch_id=bid, view=view, steps=tuple(steps), lineage=lineage(state, bid),
                   verdicts=state.verdicts, corrupt=corrupt, usage=_usage(view.usage),
                   usage_by_source=tuple((k, _usage(msgspec.structs.replace(u, source=msgspec.UNSET)))
                                         for k, u in (view.usage_by_source or {}).items()),
                   outcome=outcome, checks=checks,
                   failure=failure(tuple(steps), state.verdicts, bid, outcome, checks),
                   budget=budget.summary(state, int(time.time() * 1000)),
                   halt=f"{branch.halt.reason}: {branch.halt.message}" if isinstance(branch.halt, StepHalted) else "",
                   wakes=_wakes(state))


def _wakes(state: RunState) -> str:
    timer = timers.sleeping_timer(state.status, state.active)
    if timer is None:
        return ""
    at = datetime.fromtimestamp(timer.wake_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{at} ({timer.step_id}{', asked to be resumed' if timer.reason == 'resume_after' else ''})"


_ENDED = frozenset({"succeeded", "failed", "cancelled", "skipped"})
"""Step statuses after which a step's span has an end."""


def _agent_spans(steps: list[StepEntry]) -> list[StepEntry]:
    """Give each agent step (no attempts of its own) the span of its turns and calls: the first one's start to
    the last one's end (``None`` while one is unfinished or the agent has not finished)."""
    out = []
    for e in steps:
        if e.attempts or e.view.kind != "agent":
            out.append(e)
            continue
        kids = [k for k in steps if k.view.parent_step == e.view.step_id and k.started_ms]
        if not kids:
            out.append(e)
            continue
        ends = [k.finished_ms for k in kids]
        done = str(e.view.status) in _ENDED and None not in ends
        out.append(dataclasses.replace(e, started_ms=min(k.started_ms for k in kids),
                                       finished_ms=max(x for x in ends if x is not None) if done else None))
    return out


def _label(s: StepView) -> str:
    if s.kind == "tool" and isinstance(s.tool_name, str):
        return f"tool {s.tool_name}"
    if s.kind == "model" and isinstance(s.turn, int):
        return f"turn {s.turn}"
    return s.kind


def _last_lsn(state: RunState, bid: BranchId) -> int:
    b = state.branches[bid]
    if bid == state.active_branch:
        return state.head_lsn
    lsns = [b.created_lsn]
    for attempts in b.attempts.values():
        for a in attempts:
            lsns.append(a.outcome_lsn if a.outcome_lsn is not None else a.dispatched_lsn)
    lsns += [v.snapshot_lsn for v in state.verdicts if v.branch_id == bid]
    return max(lsns)


def lineage(state: RunState, shown: str | None = None) -> Lineage:
    """The branch graph: a lane per branch (depth-first from the root, children by fork LSN), spanning its
    first to last LSN on a shared axis, a curve from the fork point on the parent's lane, verdict marks."""
    children: dict[str | None, list[str]] = {}
    for b in state.branches.values():
        children.setdefault(b.parent_branch_id, []).append(b.branch_id)
    order: list[str] = []

    def visit(bid: str) -> None:
        order.append(bid)
        for c in sorted(children.get(bid, []), key=lambda c: (state.branches[BranchId(c)].created_lsn, c)):
            visit(c)

    for root in sorted(children.get(None, [])):
        visit(root)
    lo, hi = state.created_lsn, max(state.head_lsn, state.created_lsn + 1)

    def x(lsn: int) -> float:
        return round(LABEL_W + AXIS_W * (lsn - lo) / (hi - lo), 1)

    ys = {bid: LANE_PAD + i * LANE_H for i, bid in enumerate(order)}
    lanes = []
    for bid in order:
        b = state.branches[BranchId(bid)]
        first, last = (b.fork_lsn if b.fork_lsn is not None else b.created_lsn), _last_lsn(state, BranchId(bid))
        parent = b.parent_branch_id
        marks = tuple((x(v.snapshot_lsn), str(v.status), f"{v.verifier}: {v.status} at lsn {v.snapshot_lsn}")
                      for v in state.verdicts if v.branch_id == bid)
        lanes.append(Lane(branch_id=bid, parent=parent, fork_lsn=b.fork_lsn, from_step=b.from_step,
                          first_lsn=first, last_lsn=last, y=ys[bid], x0=x(b.created_lsn), x1=max(x(last),
                                                                                                    x(b.created_lsn)),
                          fx=x(first) if parent is not None else None, fy=ys.get(parent) if parent else None,
                          active=bid == state.active_branch, shown=bid == (shown or state.active_branch),
                          marks=marks))
    return Lineage(width=LABEL_W + AXIS_W + 190, height=LANE_PAD * 2 + max(0, len(order) - 1) * LANE_H, lo=lo,
                   hi=hi, lanes=tuple(lanes))
