"""Drop reasons and the packed token total are recorded in the partition at pack time."""

from __future__ import annotations

import msgspec

from reel.shared.core.pack.packer import Candidate, PackPolicy, drop_reasons, pack
from reel.shared.core.run.events import ContextPartition
from reel.shared.core.run.ids import ContextItemId


def _c(i: str, tokens: int = 10, **kw: object) -> Candidate:
    return Candidate(id=ContextItemId(i), tokens=tokens, **kw)  # type: ignore[arg-type]


CANDIDATES = [
    _c("sys", kind="system", required=True),
    _c("demo", kind="demo"),
    _c("old", stale=True),
    _c("a", content_hash="h1"),
    _c("a-again", content_hash="h1"),
    _c("huge", tokens=500),
    _c("g1", group="turn1"), _c("g1-obs", group="turn1", stale=True),
    _c("b"), _c("c"), _c("d"), _c("e"), _c("f"), _c("h"),
]
POLICY = PackPolicy(budget_tokens=60, exclude_kinds=("demo",), max_item_tokens=100)


def test_every_dropped_item_has_its_reason_beside_it() -> None:
    got = pack(CANDIDATES, POLICY)
    part = got.partition
    assert part.dropped == ("demo", "old", "a-again", "huge", "g1", "g1-obs")
    assert part.drop_reasons == ("excluded_kind", "stale", "duplicate", "over_item_cap", "group_dropped", "stale")
    assert dict(part.dropped_with_reasons()) == drop_reasons(CANDIDATES, POLICY)
    assert len(part.packed) == 6 and part.available == ("b", "a")  # budget 60, most recent first: 6 items of 10 tokens
    assert part.packed_tokens == got.packed_tokens == 60


def test_nothing_dropped_records_no_reasons() -> None:
    part = pack([_c("x"), _c("y")], PackPolicy(budget_tokens=100)).partition
    assert part.dropped == () and part.drop_reasons is msgspec.UNSET
    assert b"drop_reasons" not in msgspec.json.encode(part)
    assert part.packed_tokens == 20


def test_a_partition_recorded_before_reasons_decodes_and_encodes_unchanged() -> None:
    old = b'{"packed":["a"],"available":["b"],"dropped":["c","d"]}'
    part = msgspec.json.decode(old, type=ContextPartition)
    assert part.drop_reasons is msgspec.UNSET and part.packed_tokens is msgspec.UNSET
    assert part.dropped_with_reasons() == (("c", ""), ("d", ""))
    assert msgspec.json.encode(part) == old


def test_reasons_round_trip() -> None:
    part = pack(CANDIDATES, POLICY).partition
    assert msgspec.json.decode(msgspec.json.encode(part), type=ContextPartition) == part
