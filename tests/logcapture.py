"""Capture structured log lines in a test, info level included (the suite logs at WARNING)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import structlog


@contextlib.contextmanager
def info_logs() -> Iterator[list[dict[str, Any]]]:
    """The log lines emitted in the block, as dicts with the bound context merged in."""
    saved = structlog.get_config()
    capture = structlog.testing.LogCapture()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture],
                        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        yield capture.entries
    finally:
        structlog.configure(**saved)
