"""Context packing with partition capture.

Pure: :func:`pack` takes candidate items and a policy and returns the
:class:`~reel.shared.core.run.events.ContextPartition` plus the packed items in prompt order.

What the three buckets mean in Reel:

* ``dropped`` — excluded by *policy* before ranking, whatever the budget:
  an excluded kind, a stale item (when ``drop_stale``), a duplicate of an earlier
  item's content (when ``dedupe``), an item over ``max_item_tokens``, or an item
  larger than the whole budget. A bigger budget would not have added them.
* ``available`` — eligible, ranked, but not packed because the budget ran out.
  A bigger budget would have added them, in this order (best first).
* ``packed`` — what went into the prompt, in prompt (original candidate) order.

The partition records, beside ``dropped``, each dropped item's reason
(``drop_reasons``, same order: the first that applies of ``excluded_kind``, ``stale``,
``duplicate``, ``over_item_cap``, ``over_budget``, or ``group_dropped`` for a member of a
group another member took down), the packed token total (``packed_tokens``) and each item's tokens
(``item_tokens``, in the order packed, available, dropped): all are known only here, at pack time, and not
derivable afterwards.

Ranking: higher ``priority`` first, then more recent (later in the candidate
list) first. Packing is greedy first-fit over the ranking: an item that does not
fit is left ``available`` and smaller, lower-ranked items may still fit.

Two options serve agent turns and change nothing for candidates that
use neither:

* ``required`` items are always packed, before anything is ranked, and no policy
  drops them (an agent's instructions and task); their tokens come off the budget first.
* Candidates sharing a ``group`` (one turn's assistant message and its tool
  results) are one unit: packed together, left ``available`` together (in
  candidate order), or dropped together when any member is dropped by policy, or
  when the group alone is larger than the whole budget. The unit ranks by its
  highest priority, then by its first member's position. ``dedupe`` does not apply
  to group members (two calls may well return the same text).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from reel.shared.core.run.events import ContextPartition
from reel.shared.core.run.ids import ContextItemId


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One candidate context item: an id, never its text.

    Attributes:
        id: stable ``ContextItemId``.
        kind: e.g. ``system``, ``task``, ``message``, ``observation``, ``output``, ``demo``.
        tokens: token estimate of its text.
        priority: larger ranks earlier (default 0).
        stale: marked stale by its producer.
        content_hash: sha256 of its text, used for duplicate detection.
        group: candidates with the same group are packed or left out as a unit.
        required: always packed, never dropped (a required candidate is never part of a group).
    """

    id: ContextItemId
    kind: str = "message"
    tokens: int
    priority: float = 0.0
    stale: bool = False
    content_hash: str = ""
    group: str | None = None
    required: bool = False


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
    if policy.dedupe and c.group is None and c.content_hash and c.content_hash in seen:
        return "duplicate"
    if policy.max_item_tokens is not None and c.tokens > policy.max_item_tokens:
        return "over_item_cap"
    if c.tokens > policy.budget_tokens:
        return "over_budget"
    return None


class _Unit(msgspec.Struct):
    """One thing the packer ranks: an ungrouped candidate, or a whole group (positions in candidate order)."""

    positions: list[int]
    tokens: int
    priority: float


def _classify(candidates: Sequence[Candidate], policy: PackPolicy) -> tuple[dict[ContextItemId, str], list[int],
                                                                          list[_Unit]]:
    """Drop reasons by id, positions of required items, and the eligible units in candidate order."""
    reasons: dict[ContextItemId, str] = {}
    required: list[int] = []
    units: list[_Unit] = []
    groups: dict[str, _Unit] = {}
    seen: set[str] = set()
    for pos, c in enumerate(candidates):
        if c.required:
            required.append(pos)
        else:
            reason = _drop_reason(c, policy, seen)
            if reason is not None:
                reasons[c.id] = reason
                if c.group is None:
                    continue
        if c.content_hash and c.group is None and c.id not in reasons:
            seen.add(c.content_hash)
        if c.required:
            continue
        if c.group is None:
            units.append(_Unit(positions=[pos], tokens=c.tokens, priority=c.priority))
        elif c.group in groups:
            unit = groups[c.group]
            unit.positions.append(pos)
            unit.tokens += c.tokens
            unit.priority = max(unit.priority, c.priority)
        else:
            unit = groups[c.group] = _Unit(positions=[pos], tokens=c.tokens, priority=c.priority)
            units.append(unit)
    if groups:
        units = _settle_groups(candidates, policy, reasons, units, groups)
    return reasons, required, units


def _settle_groups(candidates: Sequence[Candidate], policy: PackPolicy, reasons: dict[ContextItemId, str],
                   units: list[_Unit], groups: dict[str, _Unit]) -> list[_Unit]:
    """Drop every member of a group that has a dropped member, or that alone exceeds the budget."""
    gone: set[int] = set()
    for unit in groups.values():
        ids = [candidates[p].id for p in unit.positions]
        own = any(i in reasons for i in ids)
        if not own and unit.tokens <= policy.budget_tokens:
            continue
        for i in ids:
            reasons.setdefault(i, "group_dropped" if own else "over_budget")
        gone.add(id(unit))
    return [u for u in units if id(u) not in gone]


def _fits_whole(candidates: Sequence[Candidate], policy: PackPolicy) -> int | None:
    """The token total when no policy drops a candidate and all of them fit the budget, else ``None``.

    Then :func:`pack`'s greedy pass packs every unit (their sum is within what is left after the
    required items), so the partition is every id in candidate order and nothing else: this is
    :func:`pack`'s answer in one pass, without grouping, ranking or sorting (O(candidates)).
    """
    total = 0
    seen: set[str] = set()
    budget, cap, excluded = policy.budget_tokens, policy.max_item_tokens, policy.exclude_kinds
    for c in candidates:
        total += c.tokens
        if not c.required and (c.kind in excluded or (policy.drop_stale and c.stale) or c.tokens > budget
                               or (cap is not None and c.tokens > cap)):
            return None
        if c.group is None and c.content_hash:
            if c.content_hash in seen and policy.dedupe and not c.required:
                return None
            seen.add(c.content_hash)
    return total if total <= budget else None


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
    whole = _fits_whole(candidates, policy)
    if whole is not None:  # everything fits and nothing is dropped: no ranking, the result is known
        partition = ContextPartition(packed=tuple(ids), available=(), dropped=(), packed_tokens=whole,
                                     item_tokens=tuple(c.tokens for c in candidates))
        return Packed(partition=partition, packed_tokens=whole)
    reasons, required, units = _classify(candidates, policy)
    ranked = sorted(units, key=lambda u: (-u.priority, -u.positions[0]))
    left = policy.budget_tokens - sum(candidates[p].tokens for p in required)
    packed_pos: list[int] = list(required)
    available_pos: list[int] = []
    for unit in ranked:
        if unit.tokens <= left:
            left -= unit.tokens
            packed_pos.extend(unit.positions)
        else:
            available_pos.extend(unit.positions)
    packed_pos.sort()
    dropped_pos = [p for p, i in enumerate(ids) if i in reasons]
    dropped = tuple(ids[p] for p in dropped_pos)
    packed_tokens = sum(candidates[p].tokens for p in packed_pos)
    partition = ContextPartition(
        packed=tuple(candidates[p].id for p in packed_pos), available=tuple(candidates[p].id for p in available_pos),
        dropped=dropped, drop_reasons=tuple(reasons[i] for i in dropped) if dropped else msgspec.UNSET,
        packed_tokens=packed_tokens,
        item_tokens=tuple(candidates[p].tokens for p in (*packed_pos, *available_pos, *dropped_pos)),
    )
    return Packed(partition=partition, packed_tokens=packed_tokens)


class GroupFacts(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What :func:`pack_groups` needs of one group under one policy (:func:`group_facts`): its members' ids in
    candidate order and their tokens (``member_tokens``, same order), their token total, its rank priority, and —
    when the group is dropped — each member's reason (``None``: the group is eligible)."""

    ids: tuple[ContextItemId, ...]
    member_tokens: tuple[int, ...]
    tokens: int
    priority: float
    reasons: tuple[str, ...] | None


def group_facts(members: Sequence[Candidate], policy: PackPolicy) -> GroupFacts:
    """The facts of one group (``members``: its candidates in candidate order, sharing one ``group``) under
    ``policy``, as :func:`pack` settles a group: dropped when a member is (the others ``group_dropped``) or
    when the group alone exceeds the budget (all ``over_budget``). Independent of every other candidate.

    Raises:
        ValueError: no members, a member without the group (or of another), or a required member.
    """
    if not members or members[0].group is None or any(c.group != members[0].group or c.required for c in members):
        raise ValueError("a group's members share one group and none is required")
    own = [_drop_reason(c, policy, set()) for c in members]  # no dedupe among group members: ``seen`` unused
    tokens = sum(c.tokens for c in members)
    reasons = tuple(r or "group_dropped" for r in own) if any(own) else \
        ("over_budget",) * len(members) if tokens > policy.budget_tokens else None
    return GroupFacts(ids=tuple(c.id for c in members), member_tokens=tuple(c.tokens for c in members),
                      tokens=tokens, priority=max(c.priority for c in members), reasons=reasons)


def pack_groups(head: Sequence[Candidate], groups: Sequence[GroupFacts], policy: PackPolicy) -> Packed:
    """:func:`pack` of ``head`` followed by the members of each group in turn, from the groups' facts: the same
    partition, in O(head + groups) rather than O(candidates) (an agent turn's earlier turns, kept between turns
    with their facts: shared/core/agent/memo.py).

    Raises:
        ValueError: as :func:`pack`; or a head candidate in a group.
    """
    if any(c.group is not None for c in head):
        raise ValueError("head candidates are not grouped")
    ids = [c.id for c in head]
    for g in groups:
        ids.extend(g.ids)
    if len(set(ids)) != len(ids):
        raise ValueError("candidate ids must be unique")
    if policy.budget_tokens < 0:
        raise ValueError("budget_tokens must be >= 0")
    reasons, required, head_units = _classify(head, policy)
    # (priority, position, tokens, ids, each id's tokens)
    units: list[tuple[float, int, int, tuple[ContextItemId, ...], tuple[int, ...]]] = [
        (u.priority, u.positions[0], u.tokens, tuple(head[p].id for p in u.positions),
         tuple(head[p].tokens for p in u.positions)) for u in head_units]
    dropped: list[ContextItemId] = [c.id for c in head if c.id in reasons]
    dropped_tokens: list[int] = [c.tokens for c in head if c.id in reasons]
    why = [reasons[i] for i in dropped]
    pos = len(head)
    for g in groups:
        if g.reasons is None:
            units.append((g.priority, pos, g.tokens, g.ids, g.member_tokens))
        else:
            dropped.extend(g.ids)
            dropped_tokens.extend(g.member_tokens)
            why.extend(g.reasons)
        pos += len(g.ids)
    left = policy.budget_tokens - sum(head[p].tokens for p in required)
    chosen: set[int] = set()
    available: list[ContextItemId] = []
    available_tokens: list[int] = []
    if sum(u[2] for u in units) <= left:  # all fit: no ranking
        chosen.update(u[1] for u in units)
    else:
        for _, at, tokens, members, each in sorted(units, key=lambda u: (-u[0], -u[1])):
            if tokens <= left:
                left -= tokens
                chosen.add(at)
            else:
                available.extend(members)
                available_tokens.extend(each)
    head_pos = list(required)  # head positions are below len(head), group positions not: one ``chosen``
    for u in head_units:
        if u.positions[0] in chosen:
            head_pos.extend(u.positions)
    head_pos.sort()
    packed = [head[p].id for p in head_pos]
    item_tokens = [head[p].tokens for p in head_pos]
    pos = len(head)
    for g in groups:
        if pos in chosen:
            packed.extend(g.ids)
            item_tokens.extend(g.member_tokens)
        pos += len(g.ids)
    packed_tokens = sum(item_tokens)
    partition = ContextPartition(packed=tuple(packed), available=tuple(available), dropped=tuple(dropped),
                                 drop_reasons=tuple(why) if dropped else msgspec.UNSET, packed_tokens=packed_tokens,
                                 item_tokens=(*item_tokens, *available_tokens, *dropped_tokens))
    return Packed(partition=partition, packed_tokens=packed_tokens)


def drop_reasons(candidates: Sequence[Candidate], policy: PackPolicy) -> dict[str, str]:
    """Why each dropped candidate was dropped (for ``reel show`` and debugging); a group member dropped with
    its group says ``group_dropped`` (or ``over_budget`` for a group larger than the whole budget)."""
    reasons, _, _ = _classify(candidates, policy)
    return {c.id: reasons[c.id] for c in candidates if c.id in reasons}


def reserving(policy: PackPolicy, reserved_tokens: int) -> PackPolicy:
    """``policy`` with ``reserved_tokens`` taken off its budget first (never below 0): what the prompt carries
    besides the candidates — an agent turn's tool schemas, a model step's instructions — is counted against
    the budget before any candidate is."""
    if reserved_tokens <= 0:
        return policy
    return msgspec.structs.replace(policy, budget_tokens=max(0, policy.budget_tokens - reserved_tokens))


def accounted(packed: Packed, reserved_tokens: int, tokenizer: str, budget_tokens: int) -> Packed:
    """``packed`` with its partition naming the tokens reserved outside the candidates (``reserved_tokens``),
    the token counter that counted them all (``tokenizer``, e.g. ``heuristic-v1``) and the step's whole budget
    (``budget_tokens``: the policy's before :func:`reserving` took ``reserved_tokens`` off it)."""
    partition = msgspec.structs.replace(packed.partition, reserved_tokens=reserved_tokens, tokenizer=tokenizer,
                                        budget_tokens=budget_tokens)
    return msgspec.structs.replace(packed, partition=partition)

