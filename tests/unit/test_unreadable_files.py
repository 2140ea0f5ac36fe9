"""A file that is not UTF-8 text is refused with a reason naming it, as an unreadable one is: never a traceback."""

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
