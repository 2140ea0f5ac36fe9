"""What the runs page shows, and blob pages: pure functions of folded states and bodies (no I/O).

* :func:`run_row` — one run's line on the runs page (``/``): id, status, outcome, workflow, age;
  :func:`matches` — the page's filter (``?status=…&q=…``);
* :func:`blob_refs` — every body a run's log references, by sha256 (what ``/runs/<id>/blobs/<sha>``
  may serve); :func:`blob_page` — one page of a body by byte range, cut on a UTF-8 boundary;
* :func:`compare_columns` — the compare page's branches side by side.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from reel.shared.core.agent import turnfold
from reel.shared.core.run.compare import BranchFacts, Comparison, Divergence, OutputDiff, PartitionDiff
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.ids import BranchId
from reel.shared.core.run.integrity import Corruption
from reel.shared.core.run.state import RunState, branch_failed
from reel.shared.core.verify.verification import checks_summary, reported_outcome

STATUSES = ("pending", "running", "awaiting_input", "sleeping", "verifying", "completed", "failed", "cancelled",
            "corrupt")
"""The runs page's status filter choices (``failed``: outcome ``failed``, or a step failed for good on the
active branch — :attr:`RunRow.failed`; ``corrupt``: a run with a bad commit)."""

PAGE_BYTES = 64 * 1024
"""Default page of a blob viewer (bytes)."""
MAX_PAGE_BYTES = 1024 * 1024
"""Largest page a viewer may ask for (bytes)."""


@dataclass(frozen=True)
class RunRow:
    """One run on the runs page.

    Attributes:
        outcome: the outcome as Reel reports it (:func:`reel.shared.core.verify.verification.reported_outcome`: a
        replay with
            no outcome verifier is ``unlabelled``), ``""`` until it completes.
        checks: its context checks' verdicts (``task-in-final-context=pass``), beside the outcome.
        created_ms: when the run was created (Unix ms; its ``run_created`` commit), 0 if unknown.
        corrupt: for a corrupt run, ``at lsn N: <kind>`` (its first bad commit).
        failed: its reported outcome is ``failed``, or a step of its active branch failed for good.
        errors: every attempt's error (``kind: message``) on any branch, one a line: what search also covers.
        created_lsn: the LSN of its first commit (``run_created``), 0 if unknown: the runs page's keyset key.
        finished_ms: when it completed or was cancelled (Unix ms), ``None`` while it is not finished.
        verifiers: how many verifiers it declares.
    """

    run_id: str
    status: str
    outcome: str
    workflow: str
    created_ms: int
    head_lsn: int
    commits: int
    branches: int
    active_branch: str
    labels: dict[str, str] = field(default_factory=dict)
    corrupt: str = ""
    checks: str = ""
    failed: bool = False
    errors: str = ""
    created_lsn: int = 0
    finished_ms: int | None = None
    verifiers: int = 0


def run_row(state: RunState | None, *, run_id: str = "", corrupt: Corruption | None = None) -> RunRow:
    """The :class:`RunRow` of ``state`` (for a corrupt run: its state as of the last good commit, maybe none)."""
    if corrupt is not None:
        bad = f"at lsn {corrupt.lsn}: {corrupt.kind}"
        if state is None:
            return RunRow(run_id=run_id, status="corrupt", outcome="", workflow="?", created_ms=0,
                          head_lsn=corrupt.lsn, commits=0, branches=0, active_branch="", corrupt=bad)
        return RunRow(run_id=state.run_id, status="corrupt", outcome="", workflow=state.workflow_name,
                      created_ms=state.created_ms, head_lsn=corrupt.lsn, commits=state.commits,
                      branches=len(state.branches), active_branch=state.active_branch, labels=dict(state.labels),
                      corrupt=bad, created_lsn=state.created_lsn)
    assert state is not None
    outcome = str(reported_outcome(state) or "")
    return RunRow(run_id=state.run_id, status=str(state.status), outcome=outcome,
                  workflow=state.workflow_name, created_ms=state.created_ms, head_lsn=state.head_lsn,
                  commits=state.commits, branches=len(state.branches), active_branch=state.active_branch,
                  labels=dict(state.labels), checks=checks_summary(state),
                  failed=outcome == "failed" or (state.active_branch in state.branches
                                                 and branch_failed(state, state.active_branch)),
                  errors=_errors(state), created_lsn=state.created_lsn, finished_ms=state.finished_ms,
                  verifiers=len(state.verifiers))


def _errors(state: RunState) -> str:
    lines = dict.fromkeys(f"{a.error_kind}: {a.error_message or ''}".rstrip(": ")
                          for b in state.branches.values() for attempts in b.attempts.values() for a in attempts
                          if a.error_kind)
    return "\n".join(lines)


def row_text(row: RunRow) -> str:
    """What ``q`` searches in a row, lower-cased: id, workflow, outcome, each label as ``k``, ``v`` and ``k=v`` (as
    the page shows it), every attempt's error; fields joined by a newline."""
    labels = [x for k, v in row.labels.items() for x in (k, v, f"{k}={v}")]
    return "\n".join([row.run_id, row.workflow, row.outcome, *labels, row.errors]).lower()


def postings(row: RunRow) -> set[str]:
    """The exact-match filter values ``row`` has: ``status:<s>``, ``outcome:<o>``, ``label:<k>``, ``label:<k>=<v>``,
    and ``failed`` (:attr:`RunRow.failed`)."""
    names = {f"status:{row.status}", *(f"label:{k}" for k in row.labels),
             *(f"label:{k}={v}" for k, v in row.labels.items())}
    if row.outcome:
        names.add(f"outcome:{row.outcome}")
    if row.failed:
        names.add("failed")
    return names


def status_posting(status: str) -> str:
    """The posting the status filter ``status`` selects (``failed``: :attr:`RunRow.failed`)."""
    return "failed" if status == "failed" else f"status:{status}"


def matches(row: RunRow, status: str = "", q: str = "", *, outcome: str = "", label: str = "") -> bool:
    """True if ``row`` passes the runs page's filter.

    ``status``: one of :data:`STATUSES` or empty (any; ``failed`` matches :attr:`RunRow.failed`); ``outcome``: a
    reported outcome or empty; ``label``: ``k=v`` or a label key ``k``, or empty; ``q``: a case-insensitive
    substring of :func:`row_text` (the run id, workflow, outcome, a label as ``k``, ``v`` or ``k=v``, or an
    attempt's error), empty for any.
    """
    names = postings(row)
    if (status and status_posting(status) not in names) or (outcome and f"outcome:{outcome}" not in names) \
            or (label and f"label:{label}" not in names):
        return False
    q = q.strip().lower()
    return not q or q in row_text(row)


def age(created_ms: int, now_ms: int) -> str:
    """A short age: ``42 s``, ``5 min``, ``3 h``, ``2 d`` (``?`` if unknown)."""
    if created_ms <= 0:
        return "?"
    s = max(0, (now_ms - created_ms) // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s // size} {unit}"
    return f"{s} s"


def utc(ms: int) -> str:
    """A Unix-ms moment as ``2026-12-02 06:14:33 UTC`` (seconds; ``?`` if unknown)."""
    if ms <= 0:
        return "?"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso_utc(ms: int) -> str:
    """A Unix-ms moment as ISO 8601 in UTC with milliseconds (``2026-12-02T06:14:33.123Z``: a ``<time>``'s
    ``datetime``)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def duration(ms: int) -> str:
    """A span of ``ms`` milliseconds: ``850 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``, ``3 d 4 h``."""
    ms = max(0, ms)
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    s = ms // 1000
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _refs(state: RunState) -> Iterator[BlobRef]:
    yield state.workflow_ref
    for branch in state.branches.values():
        for attempts in branch.attempts.values():
            for a in attempts:
                if a.prompt_ref is not None:
                    yield a.prompt_ref
                if a.output_ref is not None:
                    yield a.output_ref
                if isinstance(a.error_ref, BlobRef):
                    yield a.error_ref
        for agent in turnfold.agents_of(branch):
            rec = turnfold.record(branch, agent)
            if rec is None:
                continue
            if rec.finished is not None and rec.finished.output_ref is not None:
                yield rec.finished.output_ref
            for d in turnfold.declarations(branch, agent):
                if d.arguments_ref is not None:
                    yield d.arguments_ref


def blob_refs(state: RunState) -> dict[str, BlobRef]:
    """Every blob the run's log references (workflow, prompts, outputs, error bodies, tool arguments), by sha256."""
    return {r.sha256: r for r in _refs(state)}


@dataclass(frozen=True)
class BlobPage:
    """One page of a body: ``text`` is bytes ``offset`` ≤ b < ``end`` of ``total`` (bytes) decoded as UTF-8.

    ``end`` is ``total`` on the last page, else the next page's ``offset``.
    """

    sha256: str
    media_type: str
    offset: int
    end: int
    total: int
    text: str

    @property
    def last(self) -> bool:
        """True if this page reaches the end of the body."""
        return self.end >= self.total


def page_span(offset: int, length: int, total: int) -> tuple[int, int]:
    """The bytes a page of a ``total``-byte body at ``offset`` needs (:func:`blob_page`): ``[start, stop)``."""
    start = min(max(0, offset), total)
    return start, min(total, start + min(max(1, length), MAX_PAGE_BYTES) + 4)


def blob_page(data: bytes, ref: BlobRef, offset: int, length: int, *, base: int = 0,
              total: int | None = None) -> BlobPage:
    """Bytes ``offset``.. of the body (at most ``length``, clamped to 1..:data:`MAX_PAGE_BYTES`), the end moved
    back onto a UTF-8 character boundary so no character is split between pages (forward, for a page shorter
    than its first character); invalid bytes are replaced. ``data`` is the body, or (``base``, ``total``)
    its bytes from ``base`` on — at least those :func:`page_span` names — of a ``total``-byte body."""
    total = len(data) if total is None else total
    start = min(max(0, offset), total)
    end = min(total, start + min(max(1, length), MAX_PAGE_BYTES))
    if end < total:
        cut = end
        while cut > start and (data[cut - base] & 0xC0) == 0x80:  # a continuation byte: it began earlier
            cut -= 1
        if cut > start:
            end = cut
        else:  # a page shorter than its first character: the whole character
            while end < total and (data[end - base] & 0xC0) == 0x80:
                end += 1
    return BlobPage(sha256=ref.sha256, media_type=ref.media_type, offset=start, end=end, total=total,
                    text=data[start - base:end - base].decode("utf-8", errors="replace"))


@dataclass(frozen=True)
class CompareColumn:
    """One branch's column of the compare page (``/runs/<id>/compare``), beside the baseline's (the first).

    Attributes:
        facts: its verdicts, turns, tokens, cost and edits; output: its final output text (``None``: none yet).
        divergence, partition, output_diff: against the baseline (``None`` in the baseline's own column).
    """

    facts: BranchFacts
    output: str | None
    divergence: Divergence | None = None
    partition: PartitionDiff | None = None
    output_diff: OutputDiff | None = None


def compare_columns(c: Comparison, outputs: Mapping[BranchId, str | None]) -> list[CompareColumn]:
    """The columns of comparison ``c``, the baseline first (pure)."""
    div = {d.branch_id: d for d in c.divergences}
    part = {p.branch_id: p for p in c.partitions}
    out = {o.branch_id: o for o in c.outputs}
    return [CompareColumn(facts=b, output=outputs.get(b.branch_id), divergence=div.get(b.branch_id),
                          partition=part.get(b.branch_id), output_diff=out.get(b.branch_id)) for b in c.branches]
