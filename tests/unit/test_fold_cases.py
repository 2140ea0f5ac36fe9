"""Every event type of the wire union has exactly one fold case."""

from __future__ import annotations

import typing

from reel.shared.core.run.events import AnyEvent
from reel.shared.core.run.fold import _APPLY


def test_every_event_type_has_a_fold_case() -> None:
    assert set(typing.get_args(AnyEvent)) == set(_APPLY)
