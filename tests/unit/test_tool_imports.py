"""Where ``python:`` tools are looked up (shared/application/toolimports.py) and how a start carries the folder.

Real files and real imports in per-test folders; each test's module names are its own (a suffix), and the
modules, ``sys.path`` entries and the process's record of tool imports it adds are dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from reel.shared.application import toolimports
from reel.shared.application.toolimports import check_tool_imports, resolve_tool, tool_search_path
from reel.shared.core.errors import InvalidCommand, WorkflowInvalid
from reel.shared.core.run.events import BlobRef, RunCreated, decode_commit, encode_commit
from reel.shared.core.run.events import Commit as CommitBody
from reel.shared.core.run.fold import create
from reel.shared.core.run.ids import LSN, BranchId, CommitId, RunId
from reel.shared.core.wire.commands import StartRun, decode_command, encode
from reel.shared.core.workflow.spec import parse_workflow


@pytest.fixture
def fresh_imports() -> Iterator[str]:
    """A suffix for this test's module names; its modules, path entries and tool-import records are undone."""
    modules, path, loaded = set(sys.modules), list(sys.path), dict(toolimports._LOADED)
    yield secrets.token_hex(4)
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    sys.path[:] = path
    toolimports._LOADED.clear()
    toolimports._LOADED.update(loaded)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _project(tmp_path: Path, marker: str = "pyproject.toml") -> tuple[Path, Path, Path]:
    """``tmp_path/proj`` (holding ``marker``), its ``flows/deep`` folder, and a working folder outside it."""
    proj, cwd = tmp_path / "proj", tmp_path / "elsewhere"
    (proj / "flows" / "deep").mkdir(parents=True)
    cwd.mkdir()
    (proj / marker).write_text("")
    for d in (tmp_path, proj, proj / "flows", proj / "flows" / "deep", cwd):
        d.chmod(0o755)
    return proj, proj / "flows" / "deep", cwd


def test_the_search_runs_from_the_workflow_folder_up_to_the_project_root_then_the_working_folder(
        tmp_path: Path) -> None:
    proj, deep, cwd = _project(tmp_path)
    assert tool_search_path(str(deep), cwd=str(cwd)) == (str(deep), str(proj / "flows"), str(proj), str(cwd))
    assert tool_search_path(None, cwd=str(cwd)) == (str(cwd),)
    assert tool_search_path(str(proj), cwd=str(proj)) == (str(proj),)  # each folder once


def test_a_git_file_marks_the_root_too_and_without_a_marker_only_the_workflow_folder_is_searched(
        tmp_path: Path) -> None:
    proj, deep, cwd = _project(tmp_path, marker=".git")  # a worktree's .git is a file
    assert tool_search_path(str(deep), cwd=str(cwd))[-2:] == (str(proj), str(cwd))
    (proj / ".git").unlink()
    assert tool_search_path(str(deep), cwd=str(cwd)) == (str(deep), str(cwd))  # never up to the file system root


def test_missing_relative_and_world_writable_folders_are_left_out(tmp_path: Path) -> None:
    proj, deep, cwd = _project(tmp_path)
    assert tool_search_path(str(proj / "gone"), cwd=str(cwd)) == (str(cwd),)
    assert tool_search_path("proj/flows", cwd=str(cwd)) == (str(cwd),)
    (proj / "flows").chmod(0o777)
    assert tool_search_path(str(deep), cwd=str(cwd)) == (str(deep), str(proj), str(cwd))
    assert "/tmp" not in tool_search_path(None, cwd="/tmp")


def test_tools_resolve_from_each_folder_of_the_search(tmp_path: Path, fresh_imports: str) -> None:
    s = fresh_imports
    proj, deep, cwd = _project(tmp_path)
    _write(deep, {f"beside_{s}.py": f"from helper_{s} import WORD\ndef fn():\n    return WORD\n",
                  f"helper_{s}.py": "WORD = 'beside'\n"})  # a sibling import: the folder is on the path
    _write(proj, {f"pkg_{s}/__init__.py": "", f"pkg_{s}/tools.py": "def fn():\n    return 'root'\n"})
    _write(cwd, {f"cwd_{s}.py": "def fn():\n    return 'cwd'\n"})
    search = tool_search_path(str(deep), cwd=str(cwd))
    assert resolve_tool(f"beside_{s}:fn", search)() == "beside"
    assert resolve_tool(f"pkg_{s}.tools:fn", search)() == "root"
    assert resolve_tool(f"cwd_{s}:fn", search)() == "cwd"
    assert sys.path[-3:] == [str(deep), str(proj), str(cwd)]  # appended: never ahead of an installed module


def test_the_first_folder_holding_a_module_wins(tmp_path: Path, fresh_imports: str) -> None:
    s = fresh_imports
    proj, deep, cwd = _project(tmp_path)
    for d in (deep, proj, cwd):
        _write(d, {f"same_{s}.py": f"def fn():\n    return {d.name!r}\n"})
    assert resolve_tool(f"same_{s}:fn", tool_search_path(str(deep), cwd=str(cwd)))() == "deep"


def test_a_module_not_found_says_where_it_was_looked_for(tmp_path: Path, fresh_imports: str) -> None:
    s = fresh_imports
    proj, deep, cwd = _project(tmp_path)
    search = tool_search_path(str(deep), cwd=str(cwd))
    looked = f"(looked in {deep}, {proj / 'flows'}, {proj}, {cwd})"
    with pytest.raises(ModuleNotFoundError) as caught:
        resolve_tool(f"mytools_{s}:fn", search)
    assert str(caught.value) == f"No module named 'mytools_{s}' {looked}"
    _write(proj, {f"pkg_{s}/__init__.py": ""})
    with pytest.raises(ModuleNotFoundError, match=rf"^No module named 'pkg_{s}.nope' \(looked in "):
        resolve_tool(f"pkg_{s}.nope:fn", search)
    _write(proj, {f"broken_{s}.py": "import not_installed_anywhere_x\n"})  # the tool's own import: as it is
    with pytest.raises(ModuleNotFoundError) as caught:
        resolve_tool(f"broken_{s}:fn", search)
    assert str(caught.value) == "No module named 'not_installed_anywhere_x'"
    spec = parse_workflow({"name": "w", "steps": [{"kind": "agent", "id": "a", "instructions": "x",
                                                   "context": [{"id": "t", "kind": "task", "text": "x"}],
                                                   "model": {"adapter": "scripted", "turns": [{"text": "ok"}]},
                                                   "tools": [{"name": "t", "python": f"mytools_{s}:fn"}]}]})
    with pytest.raises(WorkflowInvalid) as invalid:
        check_tool_imports(spec, search=search)
    assert f"No module named 'mytools_{s}' {looked} (at `$.steps[0].tools[0].python`)" in invalid.value.message


def test_one_executor_never_serves_a_run_another_runs_module_of_the_same_name(
        tmp_path: Path, fresh_imports: str) -> None:
    s = fresh_imports
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        _write(d, {f"clash_{s}.py": f"def fn():\n    return {d.name!r}\n"})
        d.chmod(0o755)
    assert resolve_tool(f"clash_{s}:fn", (str(a),))() == "a"
    assert resolve_tool(f"clash_{s}:fn", (str(a), str(b)))() == "a"  # the same module: a is searched first
    with pytest.raises(ImportError, match=rf"module 'clash_{s}' is imported in this executor from {a}"):
        resolve_tool(f"clash_{s}:fn", (str(b),))
    assert resolve_tool("os.path:join", (str(b),)) is os.path.join  # the executor's own modules: as imported


def test_a_namespace_package_spans_the_folders_and_an_installed_package_beats_a_namespace_portion(
        tmp_path: Path, fresh_imports: str) -> None:
    s = fresh_imports
    proj, deep, cwd = _project(tmp_path)
    _write(deep, {f"ns_{s}/one.py": "def fn():\n    return 1\n"})
    _write(proj, {f"ns_{s}/two.py": "def fn():\n    return 2\n", "msgspec/readme.txt": "a data folder"})
    search = tool_search_path(str(deep), cwd=str(cwd))
    assert resolve_tool(f"ns_{s}.one:fn", search)() + resolve_tool(f"ns_{s}.two:fn", search)() == 3
    assert resolve_tool("msgspec:to_builtins", search) is msgspec.to_builtins
    _write(proj, {f"one_{s}/agent/tools.py": "def a():\n    return 'a'\ndef b():\n    return 'b'\n"})
    assert [resolve_tool(f"one_{s}.agent.tools:{f}", search)() for f in "ab"] == ["a", "b"]  # as examples.agent


def test_a_start_carries_an_absolute_normalised_source_dir_and_omits_it_when_unset() -> None:
    wf = {"name": "w", "steps": [{"id": "s", "kind": "model", "model": {"adapter": "scripted", "outputs": ["x"]}}]}
    start = decode_command(encode(StartRun(workflow=parse_workflow(wf), source_dir="/home/me/proj")), StartRun)
    assert start.source_dir == "/home/me/proj"
    assert b"source_dir" not in encode(StartRun(workflow=parse_workflow(wf)))  # older executors read it as before
    for bad in ("proj/flows", "/home/me/../etc", "/home/me/", "/a/./b", "/a\x00b", "/" + "a" * 4096):
        body = encode(msgspec.structs.replace(start, source_dir="/ok")).replace(b'"/ok"', msgspec.json.encode(bad))
        with pytest.raises(InvalidCommand, match="source_dir"):
            decode_command(body, StartRun)


def test_run_created_carries_the_source_dir_into_the_state_and_older_logs_read_the_same() -> None:
    ref = BlobRef(sha256="0" * 64, size_bytes=1, media_type="application/json")
    created = RunCreated(run_id=RunId("r-1"), branch_id=BranchId("main"), workflow_name="w", workflow_ref=ref,
                         steps=(), created_ms=1)
    body = encode_commit(CommitBody(commit_id=CommitId("c"), run_id=RunId("r-1"), events=(created,)))
    assert b"source_dir" not in body
    assert create(LSN(1), created).tool_source_dir is None
    with_dir = msgspec.structs.replace(created, source_dir="/home/me/proj/flows")
    decoded = decode_commit(encode_commit(CommitBody(commit_id=CommitId("c"), run_id=RunId("r-1"), events=(with_dir,))))
    assert decoded.events[0] == with_dir
    assert create(LSN(1), with_dir).tool_source_dir == "/home/me/proj/flows"


def test_a_scripts_main_function_is_refused_with_what_to_do_instead() -> None:
    """A tool defined in a script is ``__main__:fn``; another process's ``__main__`` (the executor's own) is not
    that script: it once resolved ``__main__:serve`` to the executor's own entry point."""
    sys.modules["__main__"].serve = lambda: "the executor's own"  # type: ignore[attr-defined]
    try:
        with pytest.raises(ImportError, match=r"script's __main__.*reel\.Worker"):
            resolve_tool("__main__:serve")
    finally:
        del sys.modules["__main__"].serve  # type: ignore[attr-defined]
    spec = parse_workflow({"name": "w", "steps": [{"kind": "agent", "id": "a", "instructions": "x",
                                                   "model": {"adapter": "scripted", "turns": [{"text": "ok"}]},
                                                   "context": [{"id": "t", "kind": "task", "text": "go"}],
                                                   "tools": [{"name": "serve", "python": "__main__:serve"}]}]})
    assert check_tool_imports(spec, {"__main__:serve": lambda: "served here"})[("a", "serve")]() == "served here"
    with pytest.raises(WorkflowInvalid, match="__main__"):
        check_tool_imports(spec)
