"""The base class of every run event (:mod:`reel.shared.core.run.events`, :mod:`reel.shared.core.input.requestevents`).

Its own module so event modules beside :mod:`reel.shared.core.run.events` can subclass it while
``events`` names them all in :data:`~reel.shared.core.run.events.AnyEvent` (no import cycle).
"""

from __future__ import annotations

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of all run events."""
