"""Code changes within a run (docs/workflow.md, "Code identity"): which attempts ran other code than the earlier
attempts of the same tool (or model adapter) on their branch, and the halt ``on_code_change: fail`` commits.

An attempt's code is its ``attempt_dispatched.code`` (:class:`~reel.shared.core.run.events.CodeIdentity`); two
identities are of the same subject when their ``(kind, name)`` are equal. Attempts without one (older logs) are
never compared. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from reel.shared.core.run.events import CodeIdentity, StepHalted
from reel.shared.core.run.ids import AttemptNo, BranchId, StepId
from reel.shared.core.run.state import AttemptState, BranchState


class CodeChange(msgspec.Struct, frozen=True, kw_only=True):
    """Attempt ``step_id#attempt`` runs ``now``; the subject's attempt before it on the branch,
    ``before_step#before_attempt``, ran ``before``; ``what``: each field that differs (``sha256 3f2a… → 9c1d…``)."""

    step_id: StepId
    attempt: AttemptNo
    now: CodeIdentity
    before_step: StepId
    before_attempt: AttemptNo
    before: CodeIdentity
    what: tuple[str, ...]

    @property
    def message(self) -> str:
        """One line: which code changed since which attempt, and how."""
        return (f"the code of {self.now.kind} {self.now.name!r} changed since {self.before_step}#{self.before_attempt}"
                f": {', '.join(self.what)}")


def _in_order(branch: BranchState) -> list[AttemptState]:
    return sorted((a for atts in branch.attempts.values() for a in atts), key=lambda a: (a.dispatched_lsn,
                                                                                           a.step_id, a.attempt))


def changes(branch: BranchState) -> dict[tuple[StepId, AttemptNo], CodeChange]:
    """Every attempt of ``branch`` (inherited ones included) whose code differs from its subject's attempt before it,
    by ``(step_id, attempt)``. O(attempts · log attempts)."""
    last: dict[tuple[str, str], AttemptState] = {}
    out: dict[tuple[StepId, AttemptNo], CodeChange] = {}
    for a in _in_order(branch):
        code = a.code
        if not isinstance(code, CodeIdentity):
            continue
        prev = last.get(code.subject)
        if prev is not None and isinstance(prev.code, CodeIdentity) and (what := code.differs(prev.code)):
            out[(a.step_id, a.attempt)] = CodeChange(step_id=a.step_id, attempt=a.attempt, now=code,
                                                     before_step=prev.step_id, before_attempt=prev.attempt,
                                                     before=prev.code, what=tuple(what))
        last[code.subject] = a
    return out


def change_before(branch: BranchState, step_id: StepId, attempt: AttemptNo, code: CodeIdentity) -> CodeChange | None:
    """How ``code`` — what attempt ``step_id#attempt``, not dispatched yet, would run — differs from the latest
    attempt of the same subject on ``branch``; ``None``: the same code, or no earlier attempt of it."""
    prev: AttemptState | None = None
    for atts in branch.attempts.values():
        for a in atts:
            if isinstance(a.code, CodeIdentity) and a.code.subject == code.subject and (
                    prev is None or a.dispatched_lsn > prev.dispatched_lsn):
                prev = a
    if prev is None or not isinstance(prev.code, CodeIdentity):
        return None
    what = code.differs(prev.code)
    if not what:
        return None
    return CodeChange(step_id=step_id, attempt=attempt, now=code, before_step=prev.step_id,
                      before_attempt=prev.attempt, before=prev.code, what=tuple(what))


def first_change(branch: BranchState, intents: Iterable[tuple[StepId, AttemptNo, CodeIdentity]]
                 ) -> CodeChange | None:
    """The first of ``intents`` (attempts about to be dispatched, with their code) whose code changed
    (:func:`change_before`), else ``None``."""
    for step_id, attempt, code in intents:
        found = change_before(branch, step_id, attempt, code)
        if found is not None:
            return found
    return None


def halt(change: CodeChange, branch_id: BranchId, at_ms: int) -> StepHalted:
    """The ``step_halted`` (``code_changed``) that ``on_code_change: fail`` commits instead of the attempt."""
    return StepHalted(branch_id=branch_id, step_id=change.step_id, reason="code_changed",
                      message=f"on_code_change: fail — {change.message}", at_ms=at_ms)
