"""The identity of the code an attempt runs (docs/workflow.md, "Code identity"): what ``attempt_dispatched.code``
records. Outside the core: it reads files, the installed distributions' metadata and ``PATH``.

==============  ===========================================================================================
kind            what is recorded
==============  ===========================================================================================
``python``      the tool function's module file (``path``), its sha256 as first read after the import (the code
                this process runs: a module is imported once per process), the installed distribution holding
                it (``version``: ``name==version``; ``None`` for a file of no installed distribution)
``command``     the executable ``argv[0]`` resolves to on the executor's ``PATH`` (``path``, real path), its
                sha256 (re-hashed when its size, mtime or inode change)
``model``       the adapter (``name``); a ``module:factory`` adapter's module file and hash as for ``python``;
                the built-in ``openai`` adapter: the ``openai`` SDK's version
``builtin``     Reel's own (a recorded or scripted tool, ``ask_user``): the Reel version only
==============  ===========================================================================================

Every identity carries the Reel version (``reel``). Failing to read a file is not an error: the identity then
has no ``sha256`` (a tool that cannot be read cannot run either, and fails on its own).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import os
import shutil
import sys
import sysconfig
from collections.abc import Callable
from types import ModuleType
from typing import Any

from reel.shared.core.run.events import CodeIdentity
from reel.shared.core.workflow.agentspec import AgentToolSpec
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.core.workflow.toolspec import ToolSpec

_MODULES: dict[str, tuple[str | None, str | None]] = {}
"""Module name → (its file, that file's sha256 as first read in this process)."""
_FILES: dict[str, tuple[tuple[int, int, int], str | None]] = {}
"""Executable path → ((size, mtime ns, inode), sha256)."""
_PYTHON: dict[tuple[str, int], tuple[Callable[..., Any], CodeIdentity]] = {}
"""(tool name, id of its function) → (the function, its identity)."""


@functools.cache
def reel_version() -> str:
    """The installed Reel's version (``unknown`` when it is not installed as a distribution)."""
    try:
        return importlib.metadata.version("reel")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


@functools.cache
def _site_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(p) + os.sep for p in {paths.get("purelib", ""), paths.get("platlib", "")} if p)


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def _distribution(module_name: str, path: str | None) -> str | None:
    """``name==version`` of the installed distribution whose files hold ``path`` (a file under site-packages
    whose top-level package a distribution provides), else ``None``."""
    if path is None or not os.path.realpath(path).startswith(_site_dirs()):
        return None
    top = module_name.partition(".")[0]
    try:  # most distributions are named as their top-level package: found by name, without a scan of them all
        dist = importlib.metadata.distribution(top)
        if top in (dist.read_text("top_level.txt") or top).split():
            return f"{dist.metadata['Name']}=={dist.version}"
    except importlib.metadata.PackageNotFoundError:
        pass
    names = _distributions().get(top, [])
    if not names:
        return None
    try:
        return f"{names[0]}=={importlib.metadata.version(names[0])}"
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_file(module: ModuleType | None, name: str) -> tuple[str | None, str | None]:
    """(file, sha256) of ``module`` as this process first saw it (see :data:`_MODULES`)."""
    found = _MODULES.get(name)
    if found is None:
        path = getattr(module, "__file__", None) if module is not None else None
        path = os.path.realpath(path) if isinstance(path, str) else None
        found = _MODULES[name] = (path, _sha256(path) if path is not None else None)
    return found


def python_identity(name: str, fn: Callable[..., Any]) -> CodeIdentity:
    """The identity of the Python tool ``name`` whose function is ``fn`` (its module's file, hash, distribution);
    the same for the process's life (a module is imported once)."""
    key = (name, id(fn))
    found = _PYTHON.get(key)
    if found is None or found[0] is not fn:
        found = _PYTHON[key] = (fn, _python_identity(name, fn))
    return found[1]


def _python_identity(name: str, fn: Callable[..., Any]) -> CodeIdentity:
    target: Any = fn
    while not inspect.isroutine(target) and callable(getattr(target, "fn", None)):  # a reel.tool's FunctionTool
        target = target.fn
    target = inspect.unwrap(target)
    module = inspect.getmodule(target)
    module_name = module.__name__ if module is not None else getattr(target, "__module__", "") or ""
    path, sha = _module_file(module, module_name)
    return CodeIdentity(kind="python", name=name, path=path, sha256=sha, version=_distribution(module_name, path),
                        reel=reel_version())


def executable_identity(name: str, program: str) -> CodeIdentity:
    """The identity of a command tool ``name`` whose ``argv[0]`` is ``program``: the file it resolves to on
    ``PATH`` (as the executor's process group would run it) and its hash."""
    path = _resolved(program, os.environ.get("PATH"))
    sha = None
    if path is not None:
        try:
            st = os.stat(path)
            key = (st.st_size, st.st_mtime_ns, st.st_ino)
            cached = _FILES.get(path)
            if cached is not None and cached[0] == key:
                sha = cached[1]
            else:
                sha = _sha256(path)
                _FILES[path] = (key, sha)
        except OSError:
            path = None
    return CodeIdentity(kind="command", name=name, path=path, sha256=sha, reel=reel_version())


@functools.lru_cache(maxsize=1024)
def _resolved(program: str, search_path: str | None) -> str | None:
    """The real path ``program`` resolves to on ``search_path`` (remembered: a PATH walk costs ~0.3 ms; a change
    of the file found is still seen, by its stat)."""
    found = shutil.which(program, path=search_path) if os.sep not in program else program
    return os.path.realpath(found) if found is not None else None


def builtin_identity(name: str) -> CodeIdentity:
    """The identity of a tool that is Reel's own (recorded, scripted, ``ask_user``)."""
    return CodeIdentity(kind="builtin", name=name, reel=reel_version())


def agent_tool_identity(tool: AgentToolSpec, fn: Callable[..., Any] | None) -> CodeIdentity:
    """The identity of an agent step's tool (``fn``: its resolved Python function, if it is a ``python:`` one)."""
    if tool.python is not None and fn is not None:
        return python_identity(tool.name, fn)
    if tool.command:
        return executable_identity(tool.name, tool.command[0])
    return builtin_identity(tool.name)


def tool_step_identity(step_id: str, tool: ToolSpec) -> CodeIdentity:
    """The identity of a plain tool step's tool (named by the step's id unless the tool has a name)."""
    name = tool.name or step_id
    if tool.type == "command" and tool.argv:
        return executable_identity(name, tool.argv[0])
    return builtin_identity(name)


def model_identity(model: ModelSpec) -> CodeIdentity:
    """The identity of a model attempt's code: its adapter (a ``module:factory`` one's module file and hash; the
    ``openai`` adapter's SDK version)."""
    return _adapter_identity(model.adapter)


@functools.cache
def _adapter_identity(adapter: str) -> CodeIdentity:
    if ":" in adapter:
        module_name = adapter.partition(":")[0]
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except Exception:  # the adapter does not import: the attempt fails on its own, recorded as such
                module = None
        path, sha = _module_file(module, module_name) if module is not None else (None, None)
        return CodeIdentity(kind="model", name=adapter, path=path, sha256=sha,
                            version=_distribution(module_name, path), reel=reel_version())
    version = None
    if adapter == "openai":
        try:
            version = f"openai=={importlib.metadata.version('openai')}"
        except importlib.metadata.PackageNotFoundError:
            version = None
    return CodeIdentity(kind="model", name=adapter, version=version, reel=reel_version())
