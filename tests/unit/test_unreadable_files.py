"""A file that is not UTF-8 text is refused with a reason naming it, as an unreadable one is (never a traceback); a
value YAML reads otherwise than it looks gets a hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.spec import load_workflow

BINARY = b"\xff\xfe\x00bin"


def test_a_binary_workflow_file_is_workflow_invalid(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(BINARY)
    with pytest.raises(WorkflowInvalid, match=r"cannot read workflow .*binary.yaml: not UTF-8 text \(byte 0\)"):
        load_workflow(path)


def test_a_binary_crucible_config_is_config_invalid(tmp_path: Path) -> None:
    from reel.services.crucible.session import load_config_file
    from reel.shared.crucible.errors import ConfigInvalid

    path = tmp_path / "crucible.yaml"
    path.write_bytes(BINARY)
    with pytest.raises(ConfigInvalid, match="not UTF-8 text"):
        load_config_file(path)


def test_a_number_yaml_reads_as_text_gets_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "sleep.yaml"
    path.write_text("name: s\nsteps:\n  - {id: nap, kind: sleep, for_s: 1e3}\n")
    with pytest.raises(WorkflowInvalid, match=r"for_s`.*YAML reads a number such as `1e12` as text"):
        load_workflow(path)
    path.write_text("name: s\nsteps:\n  - {id: nap, kind: sleep, for_s: 1.0e+3}\n")
    assert load_workflow(path).steps[0].for_s == 1000.0  # type: ignore[union-attr]
