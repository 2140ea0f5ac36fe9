"""Tools of the human-input tests (tests/integration/test_agent_input.py), named by import path in workflows."""

from __future__ import annotations

from pathlib import Path


def write_file(path: str, text: str = "") -> str:
    """Write ``text`` to ``path`` (a side effect the tests look for); refuses to overwrite."""
    p = Path(path)
    if p.exists():
        raise FileExistsError(path)
    p.write_text(text)
    return f"wrote {len(text)} characters to {p.name}"
