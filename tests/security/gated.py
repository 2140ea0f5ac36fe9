"""An async python tool (it runs inside the in-process executor) that waits until the test releases it.

:func:`arm` registers a :class:`Gate` under a token the tool gets as its argument: ``started`` when it runs,
``interrupted`` if its task was cancelled, and it returns ``released <token>`` once the test sets ``release``.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

_GATES: dict[str, Gate] = {}


@dataclass
class Gate:
    """The test's side of one tool call."""

    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    interrupted: asyncio.Event = field(default_factory=asyncio.Event)


def arm() -> Gate:
    """A fresh, registered gate."""
    gate = Gate()
    _GATES[gate.token] = gate
    return gate


async def until_released(token: str) -> str:
    """Wait for the gate's ``release``; record a cancellation in ``interrupted``."""
    gate = _GATES[token]
    gate.started.set()
    try:
        await gate.release.wait()
    except asyncio.CancelledError:
        gate.interrupted.set()
        raise
    return f"released {token}"
