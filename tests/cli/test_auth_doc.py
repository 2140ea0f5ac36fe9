"""docs/security.md's "Using it" commands agree: ``reel auth init`` (no DIR) writes the directory ``reel up --auth``
uses (``$REEL_HOME/auth``), and every path the block names after it exists once it ran."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reel.services.cli.app import app
from reel.shared.auth.authdir import AuthDir
from tests.ui.support import REPO


def _block() -> list[str]:
    text = (REPO / "docs" / "security.md").read_text()
    block = text.split("## Using it", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_docs_auth_init_writes_the_directory_reel_up_auth_uses(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REEL_HOME", raising=False)
    monkeypatch.delenv("REEL_AUTH_DIR", raising=False)
    lines = _block()
    assert lines[0].startswith("reel auth init") and lines[1] == "reel up --auth", lines
    result = CliRunner().invoke(app, lines[0].split()[1:])
    assert result.exit_code == 0, result.output
    assert AuthDir(tmp_path / ".reel" / "auth").exists(), result.output  # `reel up --auth`'s $REEL_HOME/auth
    up_help = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "300"}).output
    assert "default $REEL_HOME/auth" in " ".join(up_help.split()), up_help
    named = [p for line in lines[2:] for p in re.findall(r"(?:\. |--auth |-c )([^\s;]+)", line)]
    assert named and all((tmp_path / p).exists() for p in named), named
