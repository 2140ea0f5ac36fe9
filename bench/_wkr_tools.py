"""The no-op Python tool of bench/w_kr.py's agent variant (``bench._wkr_tools:noop``; not part of Reel)."""

from __future__ import annotations

import time


async def noop(run: int, step: int) -> dict[str, object]:
    """The peers' ~200-byte step result, stamped now (``t``, ns): async, so no thread hop."""
    return {"run": run, "step": step, "t": time.time_ns(), "model": "stub-model", "finish_reason": "stop",
            "usage": {"in": 123, "out": 45}, "content": "x" * 57}
