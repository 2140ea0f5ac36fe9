"""Outcome markers on the outcomes KV bucket: the :class:`~reel.shared.core.ports.OutcomeMarkers` port.

An executor *creates* ``<run>.<branch>.<step>.<attempt>`` → its output :class:`BlobRef` (JSON) after the
output blob and before the outcome commit (services/executor/attempts.py publishes it pipelined, with a
create-only header). Recovery reads it for an attempt whose executor is gone; finding none, it first
creates :data:`~reel.shared.core.mutators.recovery.LOST_MARKER` under the key (:meth:`KvOutcomeMarkers.claim_lost`),
so a marker that comes later — from an executor frozen past its lease — is refused by the server, and
marker and log never disagree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import structlog
from nats.js.errors import InvalidKeyError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from reel.shared.core.mutators.recovery import LOST_MARKER
from reel.shared.core.ports import OutcomeMarkers
from reel.shared.core.run.events import BlobRef

log = structlog.get_logger(__name__)


class KvOutcomeMarkers:
    """The outcome markers of one namespace's outcomes bucket."""

    def __init__(self, outcomes: KeyValue) -> None:
        self.outcomes = outcomes

    async def read(self, key: str) -> BlobRef | None:
        """The marker's output ref; ``None``: no marker, a lost claim, an invalid key, or a body that does not
        decode (logged)."""
        try:
            entry = await self.outcomes.get(key)
        except (KeyNotFoundError, InvalidKeyError):
            return None
        if entry.value == LOST_MARKER:
            return None
        try:
            return msgspec.json.decode(entry.value or b"", type=BlobRef)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.error("marker.unreadable", key=key, error=str(exc))
            return None

    async def claim_lost(self, key: str) -> BlobRef | None:
        """:meth:`read`; with no marker, create the lost claim first (a marker that landed meanwhile is returned)."""
        found = await self.read(key)
        if found is not None:
            return found
        try:
            await self.outcomes.create(key, LOST_MARKER)
        except KeyWrongLastSequenceError:  # the executor's marker landed first: it is the outcome
            return await self.read(key)
        except InvalidKeyError:
            return None
        return None


if TYPE_CHECKING:
    _port: type[OutcomeMarkers] = KvOutcomeMarkers  # the adapter satisfies its port (mypy checks it)
