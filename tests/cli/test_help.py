"""Every command's ``--help`` renders whole sentences at 80 columns: each paragraph wraps where the terminal does,
never where the docstring's source line ended (typer keeps those breaks in every paragraph but the first), and no
reStructuredText markup (````x````, ``:mod:``) reaches the user."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from reel.services.cli.app import app

WIDTH = 80


def commands(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, command)`` for every command and group below ``group`` (``serve executor``, ``crucible run``…)."""
    for name, cmd in sorted(getattr(group, "commands", {}).items()):
        path = f"{prefix} {name}".strip()
        yield path, cmd
        yield from commands(cmd, path)


PATHS = [path for path, _ in commands(typer.main.get_command(app))]


def _description(text: str) -> list[list[str]]:
    """The help's prose (between the usage line and the first box) as paragraphs of rendered lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    paras: list[list[str]] = [[]]
    for line in lines[start:]:
        if line.lstrip().startswith("╭"):
            break
        if line.strip():
            paras[-1].append(line.strip())
        elif paras[-1]:
            paras.append([])
    return [p for p in paras if p]


@pytest.mark.parametrize("path", ["", *PATHS])
def test_help_renders_whole_sentences(path: str) -> None:
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": str(WIDTH), "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    paras = _description(result.output)
    assert paras, result.output
    for para in paras:
        for line, nxt in itertools.pairwise(para):  # a line ends where the next word would not fit
            assert len(line) + 1 + len(nxt.split()[0]) > WIDTH - 2, f"{path}: broken after {line!r}:\n{result.output}"
        assert para[-1].endswith((".", ")", ":", "?", "!")), f"{path}: {para[-1]!r} ends mid-sentence"
    assert "<bool>" not in result.output, f"{path}: a flag shown as taking a value:\n{result.output}"
    prose = " ".join(" ".join(p) for p in paras)
    for markup in ("``", ":mod:", ":func:", ":class:", ":data:"):
        assert markup not in prose, f"{path}: {markup} in {prose!r}"


def test_every_command_is_checked() -> None:
    assert {"run", "show", "ls", "ui", "status", "serve executor", "auth init", "crucible run"} <= set(PATHS)


def test_a_flag_shows_no_type_and_an_option_its_type() -> None:
    out = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "120", "TERM": "dumb"}).output
    quiet = next(line for line in out.splitlines() if "--quiet" in line)
    timeout = next(line for line in out.splitlines() if "--timeout" in line)
    assert "<" not in quiet and "<float range> [x>=0.1]" in timeout, out  # a timeout must be positive
