"""The commands services send each other, as the :class:`~reel.shared.core.ports.CommandBus` port.

``resume`` and ``verify`` go to the commands stream deduplicated per (run, LSN)
(:func:`reel.shared.nats.publish.publish_resume`, :func:`~reel.shared.nats.publish.publish_verify`); ``control``
is the core-NATS signal of a committed cancel (:func:`reel.shared.nats.control.publish_control`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.aio.client import Client

from reel.shared.core.ports import CommandBus
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.control import publish_control
from reel.shared.nats.publish import publish_resume, publish_verify


class JetStreamCommandBus:
    """The command bus of one namespace over one connection."""

    def __init__(self, nc: Client, names: Names) -> None:
        self.nc, self.names = nc, names
        self.js = nc.jetstream()

    async def resume(self, run_id: str, at_lsn: int) -> None:
        """See :func:`reel.shared.nats.publish.publish_resume`."""
        await publish_resume(self.js, self.names, run_id, at_lsn)

    async def verify(self, run_id: str, branch_id: str, snapshot_lsn: int) -> None:
        """See :func:`reel.shared.nats.publish.publish_verify` (raises as it does: the trigger was not stored)."""
        await publish_verify(self.js, self.names, run_id, branch_id, snapshot_lsn)

    async def control(self, run_id: str, lsn: int) -> None:
        """See :func:`reel.shared.nats.control.publish_control` (best effort: never raises)."""
        await publish_control(self.nc, self.names, run_id, lsn)


if TYPE_CHECKING:
    _port: type[CommandBus] = JetStreamCommandBus  # the adapter satisfies its port (mypy checks it)
