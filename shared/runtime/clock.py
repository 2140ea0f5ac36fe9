"""The one place services read wall-clock time for events (the fold never does: times are event fields)."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Current Unix time in whole milliseconds (the unit of every ``*_ms`` event field)."""
    return int(time.time() * 1000)
