"""Code identity: what the executor records of the code an attempt runs (shared/application/codeid.py), and the pure
comparison of a run's attempts (shared/core/run/codeids.py) that ``reel show`` and ``on_code_change`` use."""

from __future__ import annotations

import hashlib
import io
import os
import shutil

import jsonschema
from rich.console import Console

from reel.services.timeline.render import timeline
from reel.shared.application import codeid
from reel.shared.core.run import codeids
from reel.shared.core.run.events import CodeIdentity
from reel.shared.core.workflow.modelspec import ModelSpec
from tests.golden.regen import GOLDEN_DIR, fold_log


def test_a_python_tool_of_an_installed_distribution_names_its_file_hash_and_version() -> None:
    code = codeid.python_identity("validate", jsonschema.validate)
    assert code.kind == "python" and code.path == os.path.realpath(jsonschema.validators.__file__)
    with open(code.path, "rb") as f:
        assert code.sha256 == hashlib.sha256(f.read()).hexdigest()
    assert code.version is not None and code.version.startswith("jsonschema==")
    assert code.reel == codeid.reel_version() != ""


def test_a_command_names_the_executable_it_resolves_to() -> None:
    code = codeid.executable_identity("sh-tool", "sh")
    found = shutil.which("sh")
    assert found is not None and code.path == os.path.realpath(found)
    with open(code.path, "rb") as f:
        assert code.sha256 == hashlib.sha256(f.read()).hexdigest()
    missing = codeid.executable_identity("gone", "no-such-program-here")
    assert (missing.path, missing.sha256) == (None, None)


def test_a_model_attempt_names_its_adapter() -> None:
    code = codeid.model_identity(ModelSpec(adapter="openai", model="m", base_url="http://h"))
    assert (code.kind, code.name) == ("model", "openai") and (code.version or "").startswith("openai==")
    assert codeid.model_identity(ModelSpec(adapter="scripted", outputs=("x",))).name == "scripted"


def test_changes_compare_attempts_of_the_same_subject_only() -> None:
    state, _ = fold_log(GOLDEN_DIR / "hand_budget_halt.jsonl")
    branch = state.branches["main"]
    found = codeids.changes(branch)
    assert list(found) == [("solve:t1:c0", 2)]  # the model's attempt is another subject
    change = found[("solve:t1:c0", 2)]
    assert change.what == ("sha256 dddddddddddd → eeeeeeeeeeee",)
    assert change.message == ("the code of python 'lookup' changed since solve:t1:c0#1: sha256 dddddddddddd → "
                              "eeeeeeeeeeee")
    same = CodeIdentity(kind="python", name="lookup", path="/srv/tools/mytools.py", sha256="e" * 64, reel="0.1.0")
    assert codeids.change_before(branch, "solve:t2:c0", 1, same) is None
    other = CodeIdentity(kind="python", name="lookup", path="/srv/tools/mytools.py", sha256="e" * 64, reel="0.2.0")
    moved = codeids.change_before(branch, "solve:t2:c0", 1, other)
    assert moved is not None and moved.what == ("reel 0.1.0 → 0.2.0",) and moved.before_attempt == 2
    assert codeids.change_before(branch, "x", 1, CodeIdentity(kind="python", name="new", sha256="1")) is None


def test_reel_show_marks_the_attempt_whose_code_changed() -> None:
    state, _ = fold_log(GOLDEN_DIR / "hand_budget_halt.jsonl")
    out = io.StringIO()
    Console(file=out, width=220, color_system=None).print(timeline(state))
    shown = out.getvalue()
    assert shown.count("(code changed)") == 1
    assert "solve:t1:c0#2: the code of python 'lookup' changed since solve:t1:c0#1: sha256 dddddddddddd" in shown


def test_a_reel_tool_is_identified_by_its_function_not_the_wrapper() -> None:
    import reel

    @reel.tool
    def double(x: int) -> int:
        """Double it."""
        return 2 * x

    code = codeid.python_identity("double", double)
    assert code.path == os.path.realpath(__file__) and code.version is None
