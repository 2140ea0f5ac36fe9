"""Whether the ``python:`` tools of a workflow's agent steps import.

Outside the core because it imports user code (importlib). The executor calls
:func:`check_tool_imports` when it loads a workflow, so a path that does not resolve
is refused at load with the field named, never discovered mid-run.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from reel.shared.core.errors import WorkflowInvalid
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec


def resolve_tool(path: str) -> Callable[..., Any]:
    """The callable named by ``module:function``, imported as ``python -m`` would: the working directory is on
    the import path (appended, so it never shadows an installed module) — a tool beside your workflow resolves
    when ``reel`` runs from that directory.

    Raises:
        ImportError: the module does not import; AttributeError: it has no such attribute;
        TypeError: the attribute is not callable.
    """
    module_name, _, attr = path.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise TypeError(f"{path} is a {type(fn).__name__}, not a callable")
    return fn  # type: ignore[no-any-return]


PythonTools = Mapping[tuple[str, str], Callable[..., Any]]
"""``(agent step id, tool name)`` → the resolved callable (:func:`check_tool_imports`)."""

Registered = Mapping[str, Callable[..., Any]]
"""``module:function`` path → a function object this process serves (``reel.Worker``, ``reel.local()``): such a
path resolves to its object without an import, so a tool may be a closure over the application's objects."""


def check_tool_imports(spec: WorkflowSpec, registered: Registered | None = None
                       ) -> dict[tuple[str, str], Callable[..., Any]]:
    """Resolve every ``python:`` tool of every agent step of ``spec``: from ``registered`` (read at each call:
    a live mapping), else by import (:func:`resolve_tool`).

    Returns:
        ``(agent step id, tool name)`` → the callable.

    Raises:
        WorkflowInvalid: a path that does not resolve, e.g.
            ``python tool 'my_tools:read' does not resolve: ModuleNotFoundError: … (at `$.steps[1].tools[0].python`)``.
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
                out[(step.id, tool.name)] = fn if fn is not None else resolve_tool(tool.python)
            except Exception as exc:  # any import-time error of user code is a refusal, with its message
                raise WorkflowInvalid(f"python tool {tool.python!r} does not resolve: {type(exc).__name__}: {exc}"
                                      f" (at `$.steps[{i}].tools[{j}].python`)") from exc
    return out


def unresolved_paths(spec: WorkflowSpec, registered: Registered | None = None) -> tuple[str, ...]:
    """The ``python:`` paths of ``spec``'s agent steps that resolve neither from ``registered`` nor by import,
    sorted (what an executor without the worker that serves them waits for)."""
    out: set[str] = set()
    for step in spec.steps:
        for tool in step.tools if isinstance(step, AgentStep) else ():
            if tool.python is None or (registered is not None and tool.python in registered):
                continue
            try:
                resolve_tool(tool.python)
            except Exception:  # any import-time error of user code: it does not resolve here
                out.add(tool.python)
    return tuple(sorted(out))
