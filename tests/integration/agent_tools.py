"""Tools of the live agent tests (tests/integration/test_agent_live.py), named by import path in workflows.

``lookup`` and ``charge`` are ``python:`` tools; ``agent_cmd.py`` beside this file is
the ``command:`` tool. With ``$REEL_TEST_HOLD_DIR`` set (only in the executor
subprocess that the crash test kills), attempt 1 of ``charge`` and of the command
announce themselves with a file in that folder and then never return, so the
test can kill -9 the executor between their intents and their outcomes.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

HOLD_ENV = "REEL_TEST_HOLD_DIR"
PARKED: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}
"""``park`` rendezvous by name, in this process: (arrived, release)."""
ANSWERS = {"capital-of-france": "Paris", "answer": "42"}


def meet(folder: str, me: str, other: str, timeout_s: float = 10.0) -> None:
    """Rendezvous of two tools running at once: announce ``me`` in ``folder``, wait for ``other``.

    Raises:
        TimeoutError: ``other`` never came (the tools did not run concurrently).
    """
    Path(folder, me).touch()
    deadline = time.monotonic() + timeout_s
    while not Path(folder, other).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{other} never arrived: the tools did not run concurrently")
        time.sleep(0.005)


def lookup(key: str, meet_in: str = "", idempotency_key: str = "", attempt: int = 0) -> dict[str, Any]:
    """A sync tool (runs in a thread): the value of ``key``, with the call's key and attempt echoed.
    With ``meet_in``, it first meets the command tool there (both must be running at once)."""
    if meet_in:
        meet(meet_in, "python.here", "command.here")
    return {"key": key, "value": ANSWERS.get(key, "unknown"), "idempotency_key": idempotency_key,
            "attempt": attempt}


async def charge(amount: int, *, idempotency_key: str, attempt: int) -> str:
    """An async, non-retry-safe tool: "charges" ``amount``; held forever on attempt 1 under ``$REEL_TEST_HOLD_DIR``."""
    hold = os.environ.get(HOLD_ENV)
    if hold and attempt == 1:
        await asyncio.to_thread(Path(hold, f"charge.{attempt}.started").write_text, idempotency_key)
        await asyncio.Event().wait()
    return f"charged {amount} (key {idempotency_key}, attempt {attempt})"


def explode(reason: str = "") -> str:
    """A tool that raises: its error is an observation for the model."""
    raise ValueError(f"exploded: {reason}")


def arm(name: str) -> tuple[asyncio.Event, asyncio.Event]:
    """A fresh rendezvous for ``park(name=name)``: ``(arrived, release)`` (in-process executors only)."""
    PARKED[name] = (asyncio.Event(), asyncio.Event())
    return PARKED[name]


async def park(name: str) -> str:
    """An async tool that signals ``arrived`` and returns once the test sets ``release``."""
    arrived, release = PARKED[name]
    arrived.set()
    await release.wait()
    return f"parked {name} and released"
