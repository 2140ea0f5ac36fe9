"""The packer's three buckets, checked against their written definitions.

From shared/core/pack/packer.py: ``dropped`` = excluded by policy whatever the budget (excluded
kind, stale, duplicate of an earlier *eligible* item, over the per-item cap, larger
than the whole budget); ``available`` = eligible but left out because the budget
ran out at its turn, in rank order; ``packed`` = what went in, in candidate order.
Ranking: higher priority first, then later in the candidate list first.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reel.shared.core.pack.packer import Candidate, Packed, PackPolicy, drop_reasons, pack


def c(id: str, tokens: int, **kw: object) -> Candidate:
    return Candidate(id=id, tokens=tokens, **kw)  # type: ignore[arg-type]


def ids(p: Packed) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    return p.partition.packed, p.partition.available, p.partition.dropped


# ---- the oracle: the docstring's definitions, written independently -------------------------------


def expected_drop_reason(cand: Candidate, policy: PackPolicy, eligible_hashes: set[str]) -> str | None:
    reasons = []
    if cand.kind in policy.exclude_kinds:
        reasons.append("excluded_kind")
    if policy.drop_stale and cand.stale:
        reasons.append("stale")
    if policy.dedupe and cand.content_hash and cand.content_hash in eligible_hashes:
        reasons.append("duplicate")
    if policy.max_item_tokens is not None and cand.tokens > policy.max_item_tokens:
        reasons.append("over_item_cap")
    if cand.tokens > policy.budget_tokens:
        reasons.append("over_budget")
    return reasons[0] if reasons else None


def rank_key(pos: int, cand: Candidate) -> tuple[float, int]:
    return (-cand.priority, -pos)


def check_definitions(cands: Sequence[Candidate], policy: PackPolicy, result: Packed) -> None:
    packed, available, dropped = ids(result)
    by_id = {x.id: x for x in cands}
    pos = {x.id: i for i, x in enumerate(cands)}
    all_ids = [x.id for x in cands]

    # disjoint, no repeats, union = candidates
    flat = packed + available + dropped
    assert len(flat) == len(set(flat)), "an id appears twice"
    assert set(flat) == set(all_ids)

    # dropped: exactly the items the policy excludes, for the right reason
    eligible_hashes: set[str] = set()
    want_dropped, want_reasons = [], {}
    for x in cands:
        reason = expected_drop_reason(x, policy, eligible_hashes)
        if reason is None:
            if x.content_hash:
                eligible_hashes.add(x.content_hash)
        else:
            want_dropped.append(x.id)
            want_reasons[x.id] = reason
    assert list(dropped) == want_dropped, "dropped, in candidate order"
    assert drop_reasons(cands, policy) == want_reasons

    # packed: within budget, in candidate order, token total reported
    total = sum(by_id[i].tokens for i in packed)
    assert total <= policy.budget_tokens
    assert result.packed_tokens == total
    assert sorted(packed, key=pos.__getitem__) == list(packed)

    # available: rank order; each would not have fit the budget left at its turn
    assert sorted(available, key=lambda i: rank_key(pos[i], by_id[i])) == list(available)
    ranked = sorted(packed + available, key=lambda i: rank_key(pos[i], by_id[i]))
    left = policy.budget_tokens
    for i in ranked:
        if i in available:
            assert by_id[i].tokens > left, f"{i} ({by_id[i].tokens} tokens) fit the {left} left at its turn"
        else:
            assert by_id[i].tokens <= left
            left -= by_id[i].tokens


# ---- examples ------------------------------------------------------------------------------------


def test_seed_harness_ten_candidates_budget_for_six() -> None:
    cands = [c(f"doc-{i}", 10, priority=float(i)) for i in range(10)]
    cands[0] = c("doc-0", 10, priority=0.0, stale=True)
    cands[1] = c("doc-1", 10, priority=1.0, kind="scratch")
    policy = PackPolicy(budget_tokens=60, exclude_kinds=("scratch",))
    result = pack(cands, policy)
    assert ids(result) == (
        ("doc-4", "doc-5", "doc-6", "doc-7", "doc-8", "doc-9"), ("doc-3", "doc-2"), ("doc-0", "doc-1"))
    assert result.packed_tokens == 60
    check_definitions(cands, policy, result)


def test_every_drop_reason() -> None:
    cands = [
        c("sys", 5, kind="system"),
        c("scratch", 5, kind="scratch"),
        c("old", 5, stale=True),
        c("orig", 5, content_hash="h1"),
        c("copy", 5, content_hash="h1"),
        c("huge", 40),
        c("whale", 27),
    ]
    policy = PackPolicy(budget_tokens=25, exclude_kinds=("scratch",), max_item_tokens=30)
    result = pack(cands, policy)
    assert result.partition.dropped == ("scratch", "old", "copy", "huge", "whale")
    assert drop_reasons(cands, policy) == {
        "scratch": "excluded_kind", "old": "stale", "copy": "duplicate", "huge": "over_item_cap",
        "whale": "over_budget"}
    assert result.partition.packed == ("sys", "orig")
    check_definitions(cands, policy, result)


def test_duplicate_only_of_an_eligible_item() -> None:
    """The first copy was dropped as stale, so the second is the eligible one, not a duplicate."""
    cands = [c("stale-copy", 5, stale=True, content_hash="h"), c("fresh-copy", 5, content_hash="h"),
             c("third", 5, content_hash="h")]
    policy = PackPolicy(budget_tokens=100)
    result = pack(cands, policy)
    assert ids(result) == (("fresh-copy",), (), ("stale-copy", "third"))
    assert drop_reasons(cands, policy) == {"stale-copy": "stale", "third": "duplicate"}


def test_policy_switches() -> None:
    cands = [c("a", 5, stale=True), c("b", 5, content_hash="h"), c("b2", 5, content_hash="h")]
    assert ids(pack(cands, PackPolicy(budget_tokens=100, drop_stale=False, dedupe=False))) == (
        ("a", "b", "b2"), (), ())
    assert ids(pack(cands, PackPolicy(budget_tokens=100))) == (("b",), (), ("a", "b2"))


def test_greedy_first_fit_packs_smaller_lower_ranked_items() -> None:
    cands = [c("small-low", 3, priority=0), c("big-mid", 8, priority=1), c("big-top", 8, priority=2)]
    result = pack(cands, PackPolicy(budget_tokens=12))
    assert ids(result) == (("small-low", "big-top"), ("big-mid",), ())
    check_definitions(cands, PackPolicy(budget_tokens=12), result)


def test_packed_in_candidate_order_available_in_rank_order() -> None:
    # equal priority: more recent (later) ranks first
    cands = [c(f"m{i}", 10) for i in range(6)]
    result = pack(cands, PackPolicy(budget_tokens=30))
    assert ids(result) == (("m3", "m4", "m5"), ("m2", "m1", "m0"), ())
    # priority beats recency
    cands = [c("p-high", 10, priority=5), c("mid", 10, priority=1), c("newest", 10)]
    result = pack(cands, PackPolicy(budget_tokens=10))
    assert ids(result) == (("p-high",), ("mid", "newest"), ())


def test_zero_budget_drops_nonempty_and_packs_empty_items() -> None:
    cands = [c("empty", 0), c("word", 1)]
    result = pack(cands, PackPolicy(budget_tokens=0))
    assert ids(result) == (("empty",), (), ("word",))  # "word" is larger than the whole budget


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="unique"):
        pack([c("a", 1), c("a", 2)], PackPolicy(budget_tokens=10))
    with pytest.raises(ValueError, match="budget"):
        pack([c("a", 1)], PackPolicy(budget_tokens=-1))


# ---- properties ----------------------------------------------------------------------------------


@st.composite
def candidate_lists(draw: st.DrawFn) -> list[Candidate]:
    n = draw(st.integers(0, 25))
    return [
        Candidate(
            id=f"i{k}",
            kind=draw(st.sampled_from(["message", "observation", "system", "scratch"])),
            tokens=draw(st.integers(0, 60)),
            priority=draw(st.sampled_from([0.0, 0.0, 1.0, 2.5, -1.0])),
            stale=draw(st.booleans()),
            content_hash=draw(st.sampled_from(["", "", "h1", "h2", "h3"])),
        )
        for k in range(n)
    ]


policies = st.builds(
    PackPolicy,
    budget_tokens=st.integers(0, 300),
    exclude_kinds=st.sampled_from([(), ("scratch",), ("scratch", "system")]),
    max_item_tokens=st.none() | st.integers(0, 60),
    drop_stale=st.booleans(),
    dedupe=st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(candidate_lists(), policies)
def test_partition_matches_its_definitions(cands: list[Candidate], policy: PackPolicy) -> None:
    result = pack(cands, policy)
    check_definitions(cands, policy, result)
    assert pack(list(cands), policy) == result, "pure: same input, same partition"


@settings(max_examples=200, deadline=None)
@given(candidate_lists(), policies)
def test_a_budget_for_everything_leaves_nothing_available(cands: list[Candidate], policy: PackPolicy) -> None:
    roomy = PackPolicy(budget_tokens=sum(x.tokens for x in cands), exclude_kinds=policy.exclude_kinds,
                       max_item_tokens=policy.max_item_tokens, drop_stale=policy.drop_stale, dedupe=policy.dedupe)
    result = pack(cands, roomy)
    assert result.partition.available == ()
    assert set(result.partition.dropped) == set(drop_reasons(cands, roomy))
    assert "over_budget" not in drop_reasons(cands, roomy).values()


@settings(max_examples=200, deadline=None)
@given(candidate_lists(), policies, st.integers(1, 100))
def test_more_budget_never_packs_fewer_tokens(cands: list[Candidate], policy: PackPolicy, extra: int) -> None:
    """Greedy first-fit is not set-monotone in the budget, but its token total is.

    At the first item where the two runs differ, the bigger budget packs an item larger
    than everything the smaller budget had left, so it already holds more than the smaller
    one ever will. (Candidates over the smaller budget are removed so both drop the same.)
    """
    cands = [x for x in cands if x.tokens <= policy.budget_tokens]
    bigger = PackPolicy(budget_tokens=policy.budget_tokens + extra, exclude_kinds=policy.exclude_kinds,
                        max_item_tokens=policy.max_item_tokens, drop_stale=policy.drop_stale,
                        dedupe=policy.dedupe)
    small, big = pack(cands, policy), pack(cands, bigger)
    assert big.partition.dropped == small.partition.dropped
    assert big.packed_tokens >= small.packed_tokens
