"""Python tools of tests/integration/test_timers.py: a poller that asks to be run again until its third attempt
(a ``@reel.tool`` named by its path, as a ``reel up`` executor imports it: its ``attempt`` is filled in)."""

from __future__ import annotations

from typing import Any

import reel


@reel.tool
def poll(job: str, attempt: int) -> Any:
    """Whether ``job`` is done; asks to be run again 0.5 s later until its third attempt."""
    if attempt < 3:
        return reel.resume_after(0.5, f"{job} not ready ({attempt})")
    return f"{job} done after {attempt} attempts"
