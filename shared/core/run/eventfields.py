"""Value types the events carry: blob refs, usage, context partitions, step declarations, verdicts.

Split from :mod:`reel.shared.core.run.events` (which re-exports them) to keep modules small; the wire is unchanged.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from reel.shared.core.run.ids import LSN, AttemptNo, BranchId, ContextItemId, RunId, StepId

StepKind = Literal["model", "tool", "agent", "sleep"]
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
            ``read_bound``), or an agent's tool result longer than half the turn's budget
            (:func:`reel.shared.core.agent.turncontext.cut_result`) — its text marked where bytes were left
            out (docs/context.md). Each is also in one of the three buckets. Unset (and not encoded) when none
            was.
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
        restored: ``packed`` items a fork put back (``reel fork --restore``: packed whatever the policy and the
            budget), in prompt order; a fork's ``--drop`` shows as the drop reason ``dropped_by_fork``. Unset
            (not encoded) when the turn was not edited.
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
    restored: tuple[ContextItemId, ...] | msgspec.UnsetType = msgspec.UNSET

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


class Budget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """What one run may spend (docs/workflow.md, "Budgets"): every limit is optional (``None``: no limit).

    Not the packer's ``budget_tokens`` (how many tokens of context one model call may carry): this is the
    run's total spend, across every branch.

    Attributes:
        max_tokens: input + output tokens of every model attempt (tokens).
        max_cost_usd: the cost of every model attempt (USD).
        max_wall_s: seconds from the run's creation to the start of a model or tool call (s).
        max_tool_calls: tool attempts dispatched (an agent's tool calls and tool steps, every attempt).
    """

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_wall_s: float | None = None
    max_tool_calls: int | None = None

    def over(self, default: Budget | None) -> Budget:
        """This budget with each limit it leaves unset taken from ``default`` (a namespace's)."""
        if default is None:
            return self
        return Budget(**{f: getattr(self, f) if getattr(self, f) is not None else getattr(default, f)
                         for f in self.__struct_fields__})

    @property
    def limits(self) -> bool:
        """True when at least one limit is set."""
        return any(getattr(self, f) is not None for f in self.__struct_fields__)


HaltReason = Literal["budget_exhausted", "code_changed"]
"""Why a run stopped before a step's next attempt (``step_halted``): its budget would be exceeded, or the code
the attempt would run differs from what its earlier attempts ran under ``on_code_change: fail``."""


class CodeIdentity(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The code one attempt ran (``attempt_dispatched.code``), as the executor resolved it.

    Attributes:
        kind: ``python`` (a Python tool), ``command`` (a command tool or a plain tool step), ``model`` (a model
            attempt: its adapter), ``builtin`` (Reel's own: a recorded or scripted tool, ``ask_user``).
        name: the tool's name, or the model adapter's (``openai``, ``module:factory``).
        path: a Python tool's module file, or the executable a command resolved to (absolute); ``None`` for
            code that is Reel's own.
        sha256: hex digest of the file at ``path``.
        version: the installed distribution the code belongs to, ``name==version`` (``None``: a file of no
            installed distribution, such as a tool module beside the workflow).
        reel: the Reel version that ran the attempt.
    """

    kind: str
    name: str = ""
    path: str | None = None
    sha256: str | None = None
    version: str | None = None
    reel: str = ""

    @property
    def subject(self) -> tuple[str, str]:
        """What the identity is of: ``(kind, name)`` — attempts of the same subject are compared."""
        return self.kind, self.name

    def differs(self, other: CodeIdentity) -> list[str]:
        """What changed from ``other`` to this identity, one ``field a → b`` each (empty: the same code)."""
        out = []
        for f in ("path", "sha256", "version", "reel"):
            a, b = getattr(other, f), getattr(self, f)
            if a != b:
                if f == "sha256":
                    a, b = (v[:12] if isinstance(v, str) else v for v in (a, b))
                out.append(f"{f} {a} → {b}")
        return out
