"""Fixtures shared by the live agent tests (test_agent_live.py, test_agent_takeover.py, test_agent_input.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.agent_support import KEY, KEY_ENV


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The model API key, in ``$REEL_TEST_AGENT_KEY`` for the test (the tests grep every run byte for it)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """Where the agent's command tool (agent_cmd.py) appends one JSON line per run: the test's tmp_path."""
    return tmp_path
