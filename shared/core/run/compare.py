"""Branches side by side (``reel compare``; docs/forks.md): pure functions of a folded run and the texts read.

:func:`compare` takes the run's state, the branches to compare (the first is the **baseline**: every other
branch is compared with it) and the final output text of each (read by the caller: :func:`final_output_ref`
says which blob), and returns a :class:`Comparison`:

* per branch: where it forked and with which edits, its status, the latest verdict of each verifier, its
  turns (model calls that recorded a partition), tokens in and out and cost (every attempt of the branch,
  inherited ones included, as ``EpisodeView.usage`` sums them);
* per branch but the baseline: the first model step (in step order) whose prompt or answer differs from the
  baseline's (:func:`first_divergence`), the partition diff of its fork turn (or of that step when it forked
  at an LSN) against the baseline's, and a unified diff of the final outputs;
* ``workspaces``: the diff of each branch's workspace against the baseline's, when the caller supplies one
  (a hook: no workspace is read here).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

import msgspec

from reel.shared.core.run.eventfields import BlobRef, ContextPartition
from reel.shared.core.run.forkedits import ContextEdit
from reel.shared.core.run.ids import BranchId, ContextItemId, StepId
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView, build_episode_view

DIFF_MAX_LINES = 200
"""Lines of a unified output diff kept (a longer one ends with a line saying how many were left out)."""


class BranchFacts(msgspec.Struct, frozen=True, kw_only=True):
    """One branch's row of the comparison (see the module docstring); ``verdicts``: verifier → status."""

    branch_id: BranchId
    parent_branch_id: BranchId | None = None
    fork_lsn: int | None = None
    from_step: StepId | None = None
    edits: tuple[ContextEdit, ...] = ()
    active: bool = False
    verdicts: dict[str, str] = {}
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Where ``branch_id`` first differs from the baseline: ``step_id`` (``None``: nowhere), and what differs
    there: ``prompt`` (what the model was sent), ``answer`` (what it said) or ``missing`` (one side has no answer)."""

    branch_id: BranchId
    step_id: StepId | None = None
    what: str | None = None


class PartitionDiff(msgspec.Struct, frozen=True, kw_only=True):
    """The partition of ``step_id`` on ``branch_id`` against the baseline's: items packed only on the branch
    (``packed_added``) or only on the baseline (``packed_removed``), and the branch's ``restored`` and
    fork-dropped items (``dropped_by_fork``). ``missing``: one side recorded no partition for the step."""

    branch_id: BranchId
    step_id: StepId
    packed_added: tuple[ContextItemId, ...] = ()
    packed_removed: tuple[ContextItemId, ...] = ()
    restored: tuple[ContextItemId, ...] = ()
    dropped_by_fork: tuple[ContextItemId, ...] = ()
    missing: bool = False


class OutputDiff(msgspec.Struct, frozen=True, kw_only=True):
    """The final output of ``branch_id`` against the baseline's: ``same``, else a unified diff."""

    branch_id: BranchId
    same: bool
    diff: str = ""


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """Branches × facts (see the module docstring); ``baseline`` is ``branches[0].branch_id``."""

    run_id: str
    baseline: BranchId
    verifiers: tuple[str, ...]
    branches: tuple[BranchFacts, ...]
    divergences: tuple[Divergence, ...] = ()
    partitions: tuple[PartitionDiff, ...] = ()
    outputs: tuple[OutputDiff, ...] = ()
    workspaces: dict[str, str] | None = None


def default_branches(state: RunState) -> list[BranchId]:
    """Every branch of the run in creation order (the root first: the baseline)."""
    return sorted(state.branches, key=lambda b: state.branches[b].created_lsn)


def final_output_ref(view: EpisodeView) -> BlobRef | None:
    """The blob of the branch's final output: its last workflow step's (an agent's answer) — what a verifier judges
    by default."""
    last = next((s for s in reversed(view.steps) if s.parent_step is msgspec.UNSET), None)
    if last is None:
        return None
    if isinstance(last.output_ref, BlobRef):
        return last.output_ref
    final = last.final_attempt
    return final.output_ref if final is not None else None


def _model_steps(view: EpisodeView) -> list[tuple[StepView, AttemptView]]:
    return [(s, a) for s in view.steps if s.kind == "model" and (a := s.final_attempt) is not None]


def _sha(ref: BlobRef | None) -> str | None:
    return ref.sha256 if ref is not None else None


def first_divergence(branch: EpisodeView, baseline: EpisodeView) -> Divergence:
    """The first model step of either branch, in step order, whose prompt or answer differs between them."""
    mine = {s.step_id: a for s, a in _model_steps(branch)}
    theirs = {s.step_id: a for s, a in _model_steps(baseline)}
    order = [s.step_id for s in branch.steps if s.step_id in mine]
    order += [s.step_id for s in baseline.steps if s.step_id in theirs and s.step_id not in mine]
    for step in order:
        a, b = mine.get(step), theirs.get(step)
        if a is None or b is None:
            return Divergence(branch_id=branch.branch_id, step_id=step, what="missing")
        if _sha(a.prompt_ref) != _sha(b.prompt_ref):
            return Divergence(branch_id=branch.branch_id, step_id=step, what="prompt")
        if _sha(a.output_ref) != _sha(b.output_ref):
            return Divergence(branch_id=branch.branch_id, step_id=step, what="answer")
    return Divergence(branch_id=branch.branch_id)


def _partition(view: EpisodeView, step: StepId) -> ContextPartition | None:
    try:
        sv = view.step(step)
    except KeyError:
        return None
    final = sv.final_attempt
    return final.context if final is not None else None


def partition_diff(branch: EpisodeView, baseline: EpisodeView, step: StepId) -> PartitionDiff:
    """The partition of ``step`` on ``branch`` against the baseline's (see :class:`PartitionDiff`)."""
    mine, theirs = _partition(branch, step), _partition(baseline, step)
    if mine is None or theirs is None:
        return PartitionDiff(branch_id=branch.branch_id, step_id=step, missing=True)
    restored = mine.restored if isinstance(mine.restored, tuple) else ()
    return PartitionDiff(
        branch_id=branch.branch_id, step_id=step,
        packed_added=tuple(i for i in mine.packed if i not in theirs.packed),
        packed_removed=tuple(i for i in theirs.packed if i not in mine.packed), restored=restored,
        dropped_by_fork=tuple(i for i, why in mine.dropped_with_reasons() if why == "dropped_by_fork"))


def output_diff(branch: BranchId, baseline: BranchId, mine: str | None, theirs: str | None) -> OutputDiff:
    """A unified diff of two final outputs (``None``: the branch has none yet), at most :data:`DIFF_MAX_LINES`."""
    if mine == theirs:
        return OutputDiff(branch_id=branch, same=True)
    lines = list(difflib.unified_diff((theirs or "").splitlines(), (mine or "").splitlines(), fromfile=baseline,
                                      tofile=branch, lineterm=""))
    if len(lines) > DIFF_MAX_LINES:
        lines = [*lines[:DIFF_MAX_LINES], f"… {len(lines) - DIFF_MAX_LINES} more lines"]
    return OutputDiff(branch_id=branch, same=False, diff="\n".join(lines))


def answer_text(body: bytes) -> str:
    """A final output body as text (pure): an agent's answer (its response message, a JSON object) as the
    message's ``content``; any other body decoded as UTF-8 (invalid bytes replaced)."""
    try:
        message = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body.decode(errors="replace")
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else body.decode(errors="replace")


def branch_facts(state: RunState, view: EpisodeView) -> BranchFacts:
    """The row of ``view``'s branch: where it forked, its edits, its latest verdict per verifier, turns, usage."""
    b = state.branches[view.branch_id]
    verdicts: dict[str, str] = {}
    for v in state.verdicts:  # in log order: the latest of each verifier wins
        if v.branch_id == view.branch_id:
            verdicts[v.verifier] = v.status
    own = next((e.edits for e in b.edits if e.own), ()) if isinstance(b.edits, tuple) else ()
    return BranchFacts(branch_id=b.branch_id, parent_branch_id=b.parent_branch_id, fork_lsn=b.fork_lsn,
                       from_step=b.from_step, edits=own, active=state.active_branch == b.branch_id,
                       verdicts=verdicts, turns=len(_model_steps(view)), input_tokens=view.usage.input_tokens,
                       output_tokens=view.usage.output_tokens, cost_usd=round(view.usage.cost_usd, 10))


def compare(state: RunState, branches: Sequence[BranchId], outputs: Mapping[BranchId, str | None], *,
            workspaces: Mapping[BranchId, str] | None = None) -> Comparison:
    """Compare ``branches`` of the run (the first is the baseline; see the module docstring).

    Args:
        outputs: each branch's final output text (of :func:`final_output_ref`; ``None``: none yet).
        workspaces: each branch's workspace diff against the baseline's, when the caller has them.

    Raises:
        KeyError: a branch the run does not have.
        ValueError: no branch.
    """
    if not branches:
        raise ValueError("compare needs at least one branch")
    views = [build_episode_view(state, b) for b in branches]
    base = views[0]
    divergences, partitions, diffs = [], [], []
    for view in views[1:]:
        found = first_divergence(view, base)
        divergences.append(found)
        at = state.branches[view.branch_id].from_step or found.step_id
        if at is not None:
            partitions.append(partition_diff(view, base, at))
        diffs.append(output_diff(view.branch_id, base.branch_id, outputs.get(view.branch_id),
                                 outputs.get(base.branch_id)))
    return Comparison(run_id=state.run_id, baseline=base.branch_id, verifiers=state.verifiers,
                      branches=tuple(branch_facts(state, v) for v in views), divergences=tuple(divergences),
                      partitions=tuple(partitions), outputs=tuple(diffs),
                      workspaces={str(b): d for b, d in workspaces.items()} if workspaces is not None else None)
