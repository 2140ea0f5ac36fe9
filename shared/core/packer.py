"""Context packing with partition capture (brief §7, seed T1.5).

Pure: :func:`pack` takes candidate items and a policy and returns the
:class:`~shared.core.events.ContextPartition` plus the packed items in prompt order.

What the three buckets mean in Reel:

* ``dropped`` — excluded by *policy* before ranking, whatever the budget:
  an excluded kind, a stale item (when ``drop_stale``), a duplicate of an earlier
  item's content (when ``dedupe``), an item over ``max_item_tokens``, or an item
  larger than the whole budget. A bigger budget would not have added them.
* ``available`` — eligible, ranked, but not packed because the budget ran out.
  A bigger budget would have added them, in this order (best first).
* ``packed`` — what went into the prompt, in prompt (original candidate) order.

Ranking: higher ``priority`` first, then more recent (later in the candidate
list) first. Packing is greedy first-fit over the ranking: an item that does not
fit is left ``available`` and smaller, lower-ranked items may still fit.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from shared.core.events import ContextPartition
from shared.core.ids import ContextItemId


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One candidate context item: an id, never its text.

    Attributes:
        id: stable ``ContextItemId``.
        kind: e.g. ``system``, ``task``, ``message``, ``observation``, ``output``, ``demo``.
        tokens: token estimate of its text.
        priority: larger ranks earlier (default 0).
        stale: marked stale by its producer.
        content_hash: sha256 of its text, used for duplicate detection.
    """

    id: ContextItemId
    kind: str = "message"
    tokens: int
    priority: float = 0.0
    stale: bool = False
    content_hash: str = ""


class PackPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How to choose context under a token budget (tokens)."""

    budget_tokens: int
    exclude_kinds: tuple[str, ...] = ()
    max_item_tokens: int | None = None
    drop_stale: bool = True
    dedupe: bool = True


class Packed(msgspec.Struct, frozen=True, kw_only=True):
    """Result of :func:`pack`: the partition and the token total of ``packed``."""

    partition: ContextPartition
    packed_tokens: int


def _drop_reason(c: Candidate, policy: PackPolicy, seen: set[str]) -> str | None:
    if c.kind in policy.exclude_kinds:
        return "excluded_kind"
    if policy.drop_stale and c.stale:
        return "stale"
    if policy.dedupe and c.content_hash and c.content_hash in seen:
        return "duplicate"
    if policy.max_item_tokens is not None and c.tokens > policy.max_item_tokens:
        return "over_item_cap"
    if c.tokens > policy.budget_tokens:
        return "over_budget"
    return None


def pack(candidates: Sequence[Candidate], policy: PackPolicy) -> Packed:
    """Partition ``candidates`` into packed / available / dropped.

    Raises:
        ValueError: duplicate candidate ids, or a negative budget.
    """
    ids = [c.id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("candidate ids must be unique")
    if policy.budget_tokens < 0:
        raise ValueError("budget_tokens must be >= 0")
    dropped: list[ContextItemId] = []
    eligible: list[tuple[int, Candidate]] = []
    seen: set[str] = set()
    for pos, c in enumerate(candidates):
        if _drop_reason(c, policy, seen) is not None:
            dropped.append(c.id)
            continue
        eligible.append((pos, c))
        if c.content_hash:
            seen.add(c.content_hash)
    ranked = sorted(eligible, key=lambda pc: (-pc[1].priority, -pc[0]))
    left = policy.budget_tokens
    packed_pos: list[int] = []
    available: list[ContextItemId] = []
    for pos, c in ranked:
        if c.tokens <= left:
            left -= c.tokens
            packed_pos.append(pos)
        else:
            available.append(c.id)
    packed_pos.sort()
    partition = ContextPartition(
        packed=tuple(candidates[p].id for p in packed_pos), available=tuple(available), dropped=tuple(dropped)
    )
    return Packed(partition=partition, packed_tokens=policy.budget_tokens - left)


def drop_reasons(candidates: Sequence[Candidate], policy: PackPolicy) -> dict[str, str]:
    """Why each dropped candidate was dropped (for ``reel show`` and debugging)."""
    seen: set[str] = set()
    out: dict[str, str] = {}
    for c in candidates:
        reason = _drop_reason(c, policy, seen)
        if reason is not None:
            out[c.id] = reason
        elif c.content_hash:
            seen.add(c.content_hash)
    return out
