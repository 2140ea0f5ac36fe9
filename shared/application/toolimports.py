"""Whether the ``python:`` tools of a workflow's agent steps import, and from which folders.

Outside the core because it imports user code (importlib) and reads the file system. The executor
calls :func:`check_tool_imports` when it loads a workflow, so a path that does not resolve is refused
at load with the field named and the folders searched, never discovered mid-run.

Where a tool's module is looked for (docs/workflow.md, "Where python tools are found"): a run started
from a file (``reel run FILE``) carries the file's folder (``RunCreated.source_dir``); the search path
is :func:`tool_search_path` of it — that folder, the folders above it up to the project root, then the
executor's working folder. A run started without a file (a plain NATS command, the Python API) searches
the working folder only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from types import ModuleType
from typing import Any

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec

PROJECT_MARKERS = ("pyproject.toml", ".git")
"""A folder holding one of these is a project root: the search stops there (``.git`` may be a file: a worktree)."""

_LOADED: dict[str, str] = {}
"""Top-level module name → where this process imported it from for a tool (:func:`_where`)."""


def tool_search_path(source_dir: str | None, *, cwd: str | None = None) -> tuple[str, ...]:
    """The folders a run's ``python:`` tools are looked up in, in order, each once.

    ``source_dir`` (the workflow file's folder), then each folder above it up to and including the
    nearest one holding ``pyproject.toml`` or ``.git`` (when none of them does, only ``source_dir``
    itself: the walk never climbs to the file system's root), then ``cwd`` (default: this process's
    working folder). When ``source_dir`` is not an absolute path to a directory here (a run started on
    another machine), only ``cwd`` is searched. A folder is left out unless it is an absolute path to
    an existing directory that not everyone may write to (a world-writable folder such as ``/tmp``
    could hold anybody's module).

    Args:
        source_dir: an absolute folder, or ``None`` for a run started without a file.
        cwd: the executor's working folder (tests pass another).
    """
    here = [cwd if cwd is not None else os.getcwd()]
    found: list[str] = []
    if source_dir is not None and os.path.isabs(source_dir) and os.path.isdir(source_dir):
        chain = [Path(source_dir), *Path(source_dir).parents]
        root = next((i for i, d in enumerate(chain) if any((d / m).exists() for m in PROJECT_MARKERS)), 0)
        found = [str(d) for d in chain[:root + 1]]
    out: list[str] = []
    for d in (*found, *here):
        if d not in out and _searchable(d):
            out.append(d)
    return tuple(out)


def _searchable(folder: str) -> bool:
    """An absolute path to an existing directory without write permission for others."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    return os.path.isabs(folder) and stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IWOTH


def _where(spec: ModuleSpec) -> str:
    """Where ``spec`` loads from: its file, or its namespace portions joined by ``os.pathsep``."""
    return spec.origin or os.pathsep.join(dict.fromkeys(spec.submodule_search_locations or ()))


def _looked(search: Sequence[str]) -> str:
    return f"(looked in {', '.join(search) or 'no folder'})"


def _import_top(top: str, search: Sequence[str]) -> None:
    """Make ``sys.modules[top]`` the top-level module ``top`` as found in ``search`` (Python's rules on that list:
    the first regular module or package wins, else the namespace of every portion), unless it is imported
    already or only the installed packages hold it. The folder it is found in is appended to ``sys.path``,
    so its own imports of its siblings resolve (appended: it never shadows an installed module).

    Raises:
        ImportError: this process imported ``top`` for a tool from elsewhere (another run's folders; one
            process holds one module per name); any error of the module's own import.
    """
    spec = PathFinder.find_spec(top, list(search))
    if spec is not None and spec.origin is None:  # namespace portions only: an installed regular package wins
        other = getattr(sys.modules[top], "__spec__", None) if top in sys.modules else importlib.util.find_spec(top)
        if other is not None and other.origin is not None:
            spec = None
    loaded = _LOADED.get(top)
    if loaded is not None:
        if spec is None or _where(spec) != loaded:
            raise ImportError(f"module {top!r} is imported in this executor from {loaded} (another run's folders), "
                              f"not from this run's {_looked(search)}: one executor holds one module of a name; "
                              f"rename one, or run them in separate executors", name=top)
        return
    if spec is None or top in sys.modules:  # the executor's own or an installed module: never replaced
        return
    where = _where(spec)  # before sys.path changes: a namespace package's portions follow it
    added = [f for f in dict.fromkeys(_folders_of(spec)) if f not in sys.path]
    sys.path.extend(added)  # before its code runs: its imports of its siblings resolve
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[top] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[top]
        for f in added:
            sys.path.remove(f)
        raise
    _LOADED[top] = where


def _folders_of(spec: ModuleSpec) -> list[str]:
    """The folders holding ``spec``: of its file (a package's: the folder above), or of each namespace portion
    (a namespace package re-reads its portions from ``sys.path``, so they must be on it)."""
    if spec.origin is None:
        return [os.path.dirname(p) for p in spec.submodule_search_locations or ()]
    return [os.path.dirname(os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin)]


def resolve_tool(path: str, search: Sequence[str] | None = None) -> Callable[..., Any]:
    """The callable named by ``module:function`` (of a ``@reel.tool`` function, the tool's ``served`` callable: the
    model's arguments converted to the hinted types, ``attempt`` and ``idempotency_key`` filled in — what an
    in-process executor calls), its module looked up in ``search`` (default: the working folder
    only, :func:`tool_search_path` of ``None``) and then among the installed packages.

    Raises:
        ModuleNotFoundError: no such module, e.g. ``No module named 'mytools' (looked in /a/b, /a, /cwd)``;
        ImportError: a ``__main__:`` path (a script's function: only a process serving it can call it); the
            module does not import (or is held from another run's folders, see :func:`_import_top`);
        AttributeError: it has no such attribute; TypeError: the attribute is not callable.
    """
    module_name, _, attr = path.partition(":")
    folders = tuple(search) if search is not None else tool_search_path(None)
    top = module_name.partition(".")[0]
    if top == "__main__":  # the script that defined it is another process: this one's __main__ is not it
        raise ImportError(f"{path!r} is a function of a script's __main__, which an executor in another process "
                          "cannot import (it would find its own __main__): move it into a module, or serve it from "
                          "the script with reel.Worker(client, tools=[...]) or reel.local()", name=top)
    try:
        _import_top(top, folders)
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(f"{exc.name}.")):
            raise  # a module the tool's own code imports is missing: its message as it is
        raise ModuleNotFoundError(f"No module named {exc.name!r} {_looked(folders)}", name=exc.name) from None
    fn = getattr(module, attr)
    if not callable(fn):
        raise TypeError(f"{path} is a {type(fn).__name__}, not a callable")
    served = getattr(fn, "served", None)  # a @reel.tool (reel.FunctionTool): what reel.local() and Worker call too
    return served if callable(served) and isinstance(getattr(fn, "path", None), str) else fn  # type: ignore[no-any-return]


PythonTools = Mapping[tuple[str, str], Callable[..., Any]]
"""``(agent step id, tool name)`` → the resolved callable (:func:`check_tool_imports`)."""

Registered = Mapping[str, Callable[..., Any]]
"""``module:function`` path → a function object this process serves (``reel.Worker``, ``reel.local()``): such a
path resolves to its object without an import, so a tool may be a closure over the application's objects."""


def check_tool_imports(spec: WorkflowSpec, registered: Registered | None = None, *,
                       search: Sequence[str] | None = None) -> dict[tuple[str, str], Callable[..., Any]]:
    """Resolve every ``python:`` tool of every agent step of ``spec``: from ``registered`` (read at each call:
    a live mapping), else by import from the folders ``search`` (:func:`resolve_tool`).

    Returns:
        ``(agent step id, tool name)`` → the callable.

    Raises:
        WorkflowInvalid: a path that does not resolve, e.g. ``python tool 'my_tools:read' does not resolve:
            ModuleNotFoundError: No module named 'my_tools' (looked in /a/b, /a, /cwd)
            (at `$.steps[1].tools[0].python`)``.
    """
    out: dict[tuple[str, str], Callable[..., Any]] = {}
    for i, step in enumerate(spec.steps):
        if not isinstance(step, AgentStep):
            continue
        for j, tool in enumerate(step.tools):
            if tool.python is None:
                continue
            try:
                fn = registered.get(tool.python) if registered is not None else None
                out[(step.id, tool.name)] = fn if fn is not None else resolve_tool(tool.python, search)
            except Exception as exc:  # any import-time error of user code is a refusal, with its message
                raise WorkflowInvalid(f"python tool {tool.python!r} does not resolve: {type(exc).__name__}: {exc}"
                                      f" (at `$.steps[{i}].tools[{j}].python`)") from exc
    return out


def unresolved_paths(spec: WorkflowSpec, registered: Registered | None = None, *,
                     search: Sequence[str] | None = None) -> tuple[str, ...]:
    """The ``python:`` paths of ``spec``'s agent steps that resolve neither from ``registered`` nor by import from
    the folders ``search`` (:func:`resolve_tool`), sorted (what an executor without the worker that serves them
    waits for)."""
    out: set[str] = set()
    for step in spec.steps:
        for tool in step.tools if isinstance(step, AgentStep) else ():
            if tool.python is None or (registered is not None and tool.python in registered):
                continue
            try:
                resolve_tool(tool.python, search)
            except Exception:  # any import-time error of user code: it does not resolve here
                out.add(tool.python)
    return tuple(sorted(out))
