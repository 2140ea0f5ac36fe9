"""The :class:`~reel.shared.core.ports.OutcomeMarkers` adapter (shared/nats/markers.py) on the real outcomes bucket.

Markers are only ever created: recovery's lost claim on an attempt with no marker makes a marker that
comes later (an executor frozen past its lease) fail on the server, and a marker that landed first is
what the claim returns.
"""

from __future__ import annotations

import msgspec
import pytest
from nats.js.errors import KeyWrongLastSequenceError

from reel.shared.core.mutators.recovery import LOST_MARKER
from reel.shared.core.run.events import BlobRef
from reel.shared.nats.infra import Infra
from reel.shared.nats.markers import KvOutcomeMarkers

REF = BlobRef(sha256="c" * 64, size_bytes=7)


async def test_a_marker_is_read_and_a_claim_returns_it(infra: Infra) -> None:
    markers = KvOutcomeMarkers(infra.outcomes)
    assert await markers.read("r-m1.main.a.1") is None
    await infra.outcomes.create("r-m1.main.a.1", msgspec.json.encode(REF))
    assert await markers.read("r-m1.main.a.1") == REF
    assert await markers.claim_lost("r-m1.main.a.1") == REF
    assert (await infra.outcomes.get("r-m1.main.a.1")).value == msgspec.json.encode(REF)  # not overwritten


async def test_a_claim_on_no_marker_refuses_a_later_one(infra: Infra) -> None:
    markers = KvOutcomeMarkers(infra.outcomes)
    assert await markers.claim_lost("r-m2.main.a.1") is None
    assert (await infra.outcomes.get("r-m2.main.a.1")).value == LOST_MARKER
    with pytest.raises(KeyWrongLastSequenceError):  # the frozen executor's late marker
        await infra.outcomes.create("r-m2.main.a.1", msgspec.json.encode(REF))
    assert await markers.read("r-m2.main.a.1") is None  # the claim reads as "no output"
    assert await markers.claim_lost("r-m2.main.a.1") is None  # a second claim is harmless


async def test_an_unreadable_marker_or_key_is_none(infra: Infra) -> None:
    markers = KvOutcomeMarkers(infra.outcomes)
    await infra.outcomes.create("r-m3.main.a.1", b"not json")
    assert await markers.read("r-m3.main.a.1") is None
    assert await markers.read("bad key*") is None
    assert await markers.claim_lost("bad key*") is None
