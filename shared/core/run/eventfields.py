"""Value types the events carry: blob refs, usage, context partitions, step declarations, verdicts.

Split from :mod:`reel.shared.core.run.events` (which re-exports them) to keep modules small; the wire is unchanged.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ContextItemId, RunId, StepId

StepKind = Literal["model", "tool", "agent"]
UsageSource = Literal["reported", "estimated", "recorded", "none"]
"""Where an attempt's token counts come from (docs/models.md, "Usage"): the server's ``usage``
(``reported``); Reel's own token counter, in part or whole (``estimated``: the server sent none, a
scripted answer); a recording's usage played back (``recorded``: a replayed trajectory's, a scripted
turn's written ``usage``); or nowhere (``none``: the call failed — never reached a server, or got an
error — and no usage came back; the counts are 0)."""
VerdictStatus = Literal["pass", "fail", "error"]


class BlobRef(msgspec.Struct, frozen=True, kw_only=True):
    """A reference to a body in the blob store (content-addressed).

    Attributes:
        sha256: hex digest of the body; also the object name in the store.
        size_bytes: length of the body in bytes.
        media_type: MIME type of the body, e.g. ``text/plain`` or ``application/json``.
        inline: the body itself (its UTF-8 text), for a body of at most the inline threshold
            (``REEL_INLINE_MAX_BYTES``): it rides in the commit instead of the object
            store, still named by its sha256 and read through the same ``BlobStore.get``. Unset
            (and not encoded) for a stored body.
    """

    sha256: str
    size_bytes: int
    media_type: str = "text/plain"
    inline: str | msgspec.UnsetType = msgspec.UNSET


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Resource use of one attempt: tokens, wall latency (ms) and cost (USD).

    ``source``: where the token counts come from (:data:`UsageSource`); unset (not encoded) on tool
    attempts and in usage recorded before sources were (read as ``reported``: :func:`usage_source`).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0
    cost_usd: float = 0.0
    source: UsageSource | msgspec.UnsetType = msgspec.UNSET


def usage_source(usage: Usage) -> UsageSource:
    """``usage.source``, or ``reported`` when it is unset (a tool attempt's, or one recorded before sources were)."""
    return "reported" if isinstance(usage.source, msgspec.UnsetType) else usage.source


class ContextPartition(msgspec.Struct, frozen=True, kw_only=True):
    """Which candidate context items a model-step attempt saw.

    All three are ordered tuples of ``ContextItemId``; they are disjoint and their
    union is the full candidate set. Ids only, never text (the packed text lives in
    the attempt's prompt blob).

    Attributes:
        packed: items that went into the prompt, in prompt order.
        available: eligible items left out only because the token budget ran out,
            in rank order (best first) — what a bigger budget would have added.
        dropped: items excluded by policy before packing (excluded kind, stale,
            duplicate, over the per-item cap, or larger than the whole budget).
        drop_reasons: why each ``dropped`` item was dropped, beside it (same order, same
            length): ``excluded_kind``, ``stale``, ``duplicate``, ``over_item_cap``,
            ``over_budget`` or ``group_dropped`` (:mod:`reel.shared.core.pack.packer`); identifiers,
            never text. Unset (and not encoded) when nothing was dropped and in partitions
            recorded before reasons were (old logs decode and fold unchanged).
        packed_tokens: the token total of ``packed`` as the packer counted it (tokens); unset
            in partitions recorded before it was.
        trimmed: candidates whose text was cut to its head and tail *before* packing — an earlier
            output larger than the step's budget could use (more than
            :data:`~reel.shared.core.run.planning.READ_BYTES_PER_TOKEN` bytes per budget token; reason
            ``read_bound``), its text marked where bytes were left out (docs/context.md). Each is
            also in one of the three buckets. Unset (and not encoded) when none was.
        reserved_tokens: tokens of what the prompt carries besides the candidates, counted against the
            budget before them (tokens): an agent turn's tool schemas as sent (the JSON of the request's
            ``tools``), a model step's instructions. ``packed_tokens + reserved_tokens`` is Reel's estimate
            of the whole prompt. Unset in partitions recorded before it was.
        tokenizer: the token counter every count of this partition comes from (its ``name``, e.g.
            ``heuristic-v1``: an estimate, not the model's tokenizer); unset in older partitions.
        item_tokens: each item's tokens as the packer counted them (tokens), in the order ``packed``, then
            ``available``, then ``dropped`` (as long as the three together; a grouped item counts alone, its
            group is packed or left out as the sum). Unset in partitions recorded before it was.
        budget_tokens: the step's whole token budget (tokens), ``reserved_tokens`` included: what
            ``reserved_tokens + packed_tokens`` had to fit in; an ``available`` item did not fit in what was
            left. Unset in partitions recorded before it was.
    """

    packed: tuple[ContextItemId, ...]
    available: tuple[ContextItemId, ...]
    dropped: tuple[ContextItemId, ...]
    drop_reasons: tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    packed_tokens: int | msgspec.UnsetType = msgspec.UNSET
    trimmed: tuple[ContextItemId, ...] | msgspec.UnsetType = msgspec.UNSET
    reserved_tokens: int | msgspec.UnsetType = msgspec.UNSET
    tokenizer: str | msgspec.UnsetType = msgspec.UNSET
    item_tokens: tuple[int, ...] | msgspec.UnsetType = msgspec.UNSET
    budget_tokens: int | msgspec.UnsetType = msgspec.UNSET

    def dropped_with_reasons(self) -> tuple[tuple[ContextItemId, str], ...]:
        """``(id, reason)`` per dropped item, in order; the reason is ``""`` where none was recorded."""
        reasons = self.drop_reasons if isinstance(self.drop_reasons, tuple) else ()
        return tuple((i, reasons[k] if k < len(reasons) else "") for k, i in enumerate(self.dropped))


class StepDecl(msgspec.Struct, frozen=True, kw_only=True):
    """The fold's view of one workflow step: enough to know when it is terminal.

    Attributes:
        max_attempts: attempts of the step (of each turn, for an agent step).
        max_turns, max_parallel_tools: agent steps only (unset and not encoded otherwise):
            the loop's turn bound, and how many tool calls of one turn run at once.
    """

    step_id: StepId
    kind: StepKind
    max_attempts: int = 1
    max_turns: int | msgspec.UnsetType = msgspec.UNSET
    max_parallel_tools: int | msgspec.UnsetType = msgspec.UNSET


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """A verifier's answer about a specific point of one run's log.

    Attributes:
        run_id, branch_id: what was judged.
        snapshot_lsn: the LSN the judged ``EpisodeView`` was built at.
        verifier: configured verifier name; ``verifier_version`` its version.
        step_id, attempt: the step/attempt judged, if the verifier is step-scoped.
        status: ``pass``, ``fail`` or ``error`` (the verifier raised or timed out).
        score: 0.0–1.0.
        reason: one human-readable line.
        at_ms: when the verdict was produced (epoch ms).
    """

    run_id: RunId
    branch_id: BranchId
    snapshot_lsn: LSN
    verifier: str
    verifier_version: str = "1"
    step_id: StepId | None = None
    attempt: AttemptNo | None = None
    status: VerdictStatus
    score: float = 0.0
    reason: str = ""
    at_ms: int = 0
