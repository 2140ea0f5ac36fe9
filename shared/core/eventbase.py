"""The base class of every run event (:mod:`shared.core.events`, :mod:`shared.core.inputevents`).

Its own module so event modules beside :mod:`shared.core.events` can subclass it while
``events`` names them all in :data:`~shared.core.events.AnyEvent` (no import cycle).
"""

from __future__ import annotations

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of all run events."""
