"""What a run's page shows: pure functions of a folded :class:`RunState` (no I/O).

:func:`run_page` builds, for one branch, the timeline (each step and agent turn or tool
call with every attempt — failed, superseded, cancelled — its LSNs, usage, partition,
prompt/output refs, a call's arguments and input request) from
:func:`~reel.shared.core.run.views.build_episode_view`, and :func:`lineage`, the branch graph as
lanes on an LSN axis (what the page draws as inline SVG).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from reel.shared.core.agent import turnfold
from reel.shared.core.input.requeststate import InputRecord
from reel.shared.core.run.events import BlobRef, ContextPartition, Verdict
from reel.shared.core.run.ids import BranchId
from reel.shared.core.run.integrity import Corruption
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView, build_episode_view
from reel.shared.core.verify.reportedoutcome import context_checks, reported_outcome

PARTITION_GROUPS = ("packed", "available", "dropped")
LANE_H, LANE_PAD, AXIS_W, LABEL_W = 34, 22, 720, 200
"""Lineage graph geometry (SVG user units): lane height, top padding, LSN axis width, label column."""


@dataclass(frozen=True)
class PartitionItem:
    """One context item of a partition and what the partition records about it (tokens, drop reason)."""

    item_id: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Partition:
    """A model attempt's partition: ids by group, per-item notes, and any scalar fields recorded."""

    groups: tuple[tuple[str, tuple[PartitionItem, ...]], ...]
    extra: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class AttemptEntry:
    """One attempt on the timeline: the view, its bar on the run's LSN axis (percent) and its usage fields."""

    view: AttemptView
    bar_left: float
    bar_width: float
    usage: tuple[tuple[str, Any], ...]
    partition: Partition | None


@dataclass(frozen=True)
class StepEntry:
    """One step (or an agent's turn or tool call) on the timeline.

    Attributes:
        depth: 1 for an agent's turns and calls, else 0.
        arguments, arguments_ref: a tool call's raw JSON arguments, inline or by blob.
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
        outcome: the reported outcome (:func:`reel.shared.core.verify.reportedoutcome.reported_outcome`), ``""`` until
        completed.
        checks: the names of the run's context checks (verifiers reported beside the outcome, not as it).
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
    """The partition's groups with per-item notes from whatever else it records about items.

    Besides ``packed``/``available``/``dropped``, a field that maps item ids to values (tokens,
    reasons), lists values beside a group item for item (``drop_reasons`` beside ``dropped``:
    same length, the name begins as the group's), or lists ``[id, value]`` pairs or objects
    naming an item (``id`` / ``item_id`` / ``item``), becomes notes on those items; any other
    scalar field (``packed_tokens``) is shown as is.
    """
    data: dict[str, Any] = msgspec.to_builtins(context)
    notes: dict[str, list[str]] = {}
    extra: list[tuple[str, str]] = []
    for key, value in data.items():
        if key in PARTITION_GROUPS:
            continue
        if isinstance(value, dict):
            for item, v in value.items():
                notes.setdefault(str(item), []).append(f"{key}: {v}")
        elif isinstance(value, (list, tuple)) and (group := _beside(key, value, data)) is not None:
            for item, v in zip(data[group], value, strict=True):  # e.g. drop_reasons beside dropped
                notes.setdefault(str(item), []).append(f"{key.removeprefix(group[:4]).strip('_') or key}: {v}")
        elif isinstance(value, (list, tuple)):
            for entry in value:
                _note(notes, key, entry)
        else:
            extra.append((key, str(value)))
    groups = tuple((g, tuple(PartitionItem(str(i), tuple(notes.get(str(i), ()))) for i in data.get(g, ())))
                   for g in PARTITION_GROUPS)
    return Partition(groups=groups, extra=tuple(extra))


def _beside(key: str, value: list[Any] | tuple[Any, ...], data: dict[str, Any]) -> str | None:
    """The group a list of plain values stands beside, item for item: same length, and its name begins as the
    group's does (``drop_reasons`` beside ``dropped``)."""
    if any(isinstance(v, (list, tuple, dict)) for v in value):
        return None
    return next((g for g in PARTITION_GROUPS if key.startswith(g[:4]) and len(data.get(g, ())) == len(value)), None)


def _note(notes: dict[str, list[str]], key: str, entry: Any) -> None:
    if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str):
        notes.setdefault(entry[0], []).append(f"{key}: {entry[1]}")
    elif isinstance(entry, dict):
        ident = next((entry[k] for k in ("id", "item_id", "item") if k in entry), None)
        if ident is not None:
            rest = ", ".join(f"{k} {v}" for k, v in entry.items() if k not in ("id", "item_id", "item"))
            notes.setdefault(str(ident), []).append(f"{key}: {rest}" if rest else key)


def _usage(usage: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(msgspec.to_builtins(usage).items())


def run_page(state: RunState, branch_id: str | None = None, *, corrupt: Corruption | None = None) -> RunPage:
    """The run page of ``branch_id`` (default: the active branch).

    Raises:
        KeyError: no such branch.
    """
    bid = BranchId(branch_id) if branch_id else state.active_branch
    branch = state.branches[bid]
    view = build_episode_view(state, bid)
    lo, span = state.created_lsn, max(1, state.head_lsn - state.created_lsn)
    steps = []
    for s in view.steps:
        entries = []
        for a in s.attempts:
            end = a.outcome_lsn if a.outcome_lsn is not None else state.head_lsn
            entries.append(AttemptEntry(
                view=a, bar_left=round(100 * (a.dispatched_lsn - lo) / span, 2),
                bar_width=round(max(0.6, 100 * (end - a.dispatched_lsn) / span), 2), usage=_usage(a.usage),
                partition=partition(a.context) if a.context is not None else None))
        decl = turnfold.declared(branch, s.step_id) if isinstance(s.parent_step, str) else None
        steps.append(StepEntry(
            view=s, depth=1 if isinstance(s.parent_step, str) else 0, label=_label(s), attempts=tuple(entries),
            arguments=decl.arguments if decl else None, arguments_ref=decl.arguments_ref if decl else None,
            call_id=s.call_id if isinstance(s.call_id, str) else "", is_error=s.is_error is True,
            input=s.input if isinstance(s.input, InputRecord) else None,
            output_ref=s.output_ref if isinstance(s.output_ref, BlobRef) else None,
            error_kind=s.error_kind if isinstance(s.error_kind, str) else None))
    outcome, checks = reported_outcome(state) or "", context_checks(state)
    return RunPage(state=state, branch_id=bid, view=view, steps=tuple(steps), lineage=lineage(state, bid),
                   verdicts=state.verdicts, corrupt=corrupt, usage=_usage(view.usage),
                   usage_by_source=tuple((k, _usage(msgspec.structs.replace(u, source=msgspec.UNSET)))
                                         for k, u in (view.usage_by_source or {}).items()),
                   outcome=outcome, checks=checks,
                   failure=failure(tuple(steps), state.verdicts, bid, outcome, checks))


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
