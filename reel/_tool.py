"""Tools of the Python API: ``@reel.tool`` on a function, and the tool kinds that need no Python.

A :class:`FunctionTool` is a plain or ``async`` function with its
:class:`~reel.shared.core.workflow.agentspec.AgentToolSpec`: the tool's name (the function's unless
given), its description (the docstring's first paragraph) and the JSON Schema of its arguments, built
from the signature's type hints by msgspec (each ``Args:`` entry of a Google-style docstring becomes
that property's ``description``). Its spec names it by ``python: "<module>:<function>"``, exactly as a
YAML workflow would, so the run's log is the same either way; the executor of :func:`reel.local` or a
:class:`reel.Worker` calls the function object itself (no import), so a tool may close over the
application's objects.

A parameter named ``idempotency_key`` (``str``: ``<run>/<branch>/<step>``, the same on every attempt of
one call) or ``attempt`` (``int``, 1-based) is filled in by the executor and left out of the schema.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload

import msgspec

from reel.shared.core.run.timers import ResumeAfter
from reel.shared.core.workflow.agentspec import AgentToolSpec, InputSpec, RecordedToolSpec, check_tool
from reel.shared.core.workflow.mcpspec import McpServerSpec

P = ParamSpec("P")
R = TypeVar("R")

INJECTED = frozenset({"idempotency_key", "attempt"})
"""Parameters the executor fills in (never shown to the model)."""

_ARG_LINE = re.compile(r"^\s{2,}(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?|Attributes)\s*:\s*$")


class Tool:
    """A tool an :class:`reel.Agent` may call: its spec (name, description, parameters, implementation).

    Attributes:
        spec: the :class:`~reel.shared.core.workflow.agentspec.AgentToolSpec` the workflow holds.
    """

    def __init__(self, spec: AgentToolSpec) -> None:
        check_tool(spec, f"tool {spec.name!r}")
        self.spec = spec

    @property
    def name(self) -> str:
        """The name the model calls it by (``[A-Za-z0-9_-]{1,64}``)."""
        return self.spec.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r})"


class FunctionTool(Tool, Generic[P, R]):
    """A Python function as a tool (made by :func:`tool`); calling it calls the function.

    Attributes:
        fn: the function itself; path: its ``module:function`` name in the workflow.
        served: what the executor calls: ``fn`` with the model's JSON arguments converted to the hinted types
            first (a ``msgspec.Struct``, a ``tuple``, a ``datetime``…; the signature is ``fn``'s).
    """

    def __init__(self, fn: Callable[P, R], spec: AgentToolSpec, args_type: type[msgspec.Struct] | None = None) -> None:
        super().__init__(spec)
        self.fn = fn
        self.path = spec.python or ""
        self.served: Callable[..., Any] = fn if args_type is None else _typed_call(fn, args_type)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)


@overload
def tool(fn: Callable[P, R], /, *, name: str | None = None, description: str | None = None,
         parameters: Mapping[str, Any] | None = None, retry_safe: bool = False, needs_approval: bool = False,
         timeout_s: float = 60.0, max_output_bytes: int | None = None, max_attempts: int = 1, fatal: bool = False,
         ask: InputSpec | None = None) -> FunctionTool[P, R]: ...


@overload
def tool(*, name: str | None = None, description: str | None = None, parameters: Mapping[str, Any] | None = None,
         retry_safe: bool = False, needs_approval: bool = False, timeout_s: float = 60.0,
         max_output_bytes: int | None = None, max_attempts: int = 1, fatal: bool = False,
         ask: InputSpec | None = None) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(fn: Callable[P, R] | None = None, /, *, name: str | None = None, description: str | None = None,
         parameters: Mapping[str, Any] | None = None, retry_safe: bool = False, needs_approval: bool = False,
         timeout_s: float = 60.0, max_output_bytes: int | None = None, max_attempts: int = 1, fatal: bool = False,
         ask: InputSpec | None = None) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Make a plain or ``async`` function a tool: ``@reel.tool``, ``@reel.tool(name=…, …)``, or
    ``reel.tool(existing_function, …)``.

    Args:
        name: the name the model calls (default: the function's ``__name__``).
        description: shown to the model (default: the docstring's first paragraph).
        parameters: the arguments' JSON Schema (an object), instead of the one built from the type hints.
        retry_safe: calling it again with the same arguments has the effect of one call; after an executor
            crash mid-call it is called again (else the call is recorded ``outcome_unknown`` and the model told).
        needs_approval: each call waits for a human's approval (``RunHandle.approve`` / ``reject``).
        timeout_s: deadline of one call (s; a sync function's thread is abandoned past it, not killed).
        max_output_bytes: cap on the result text (bytes; past it the model sees the head, marked truncated).
        max_attempts: attempts of one call (a raised exception is retried).
        fatal: a failure after the last attempt fails the agent step (else the model sees it as an error).
        ask: how the human is asked for approval (who, deadline in s, what the deadline decides).

    Returns:
        A :class:`FunctionTool` (calling it calls the function), or the decorator that makes one.

    Raises:
        TypeError: the function takes ``*args``/``**kwargs``, or a type hint has no JSON Schema.
        WorkflowInvalid: the name or options are invalid (e.g. a name outside ``[A-Za-z0-9_-]{1,64}``).
    """
    def make(f: Callable[P, R]) -> FunctionTool[P, R]:
        tool_name = name or f.__name__
        args_type = None if parameters is not None else args_struct(f)
        spec = AgentToolSpec(
            name=tool_name, description=description if description is not None else _summary(f),
            parameters=_object(parameters) if args_type is None else schema_of(f, args_type),
            python=python_path(f, tool_name),
            retry_safe=retry_safe, needs_approval=needs_approval, timeout_s=timeout_s, max_attempts=max_attempts,
            fatal=fatal, input=ask,
            max_output_bytes=msgspec.UNSET if max_output_bytes is None else max_output_bytes)
        return FunctionTool(f, spec, args_type)

    return make if fn is None else make(fn)


def python_path(fn: Callable[..., Any], tool_name: str) -> str:
    """The ``module:function`` a workflow names ``fn`` by: ``fn.__module__`` and ``fn.__name__`` (the tool's name,
    ``-`` as ``_``, where ``__name__`` is no identifier, e.g. a lambda)."""
    attr = fn.__name__ if getattr(fn, "__name__", "").isidentifier() else tool_name.replace("-", "_")
    return f"{getattr(fn, '__module__', None) or '__main__'}:{attr}"


def command_tool(name: str, argv: Sequence[str], *, description: str = "", parameters: Mapping[str, Any] | None = None,
                 retry_safe: bool = False, needs_approval: bool = False, timeout_s: float = 60.0,
                 max_output_bytes: int | None = None, env: Mapping[str, str] | None = None,
                 pass_env: Sequence[str] | None = None) -> Tool:
    """A tool that runs ``argv`` (no shell) with the call's arguments as JSON on stdin; its output is the result.

    Args:
        env: variables set for it; pass_env: names passed through from the executor's environment (nothing
            else of it reaches the command).
        Others: as :func:`tool` (``max_output_bytes``: stdout and stderr merged).

    Raises:
        WorkflowInvalid: an empty ``argv``, an invalid name, a ``REEL_NATS_*`` variable.
    """
    return Tool(AgentToolSpec(
        name=name, description=description, parameters=_object(parameters), command=tuple(argv),
        retry_safe=retry_safe, needs_approval=needs_approval, timeout_s=timeout_s,
        max_output_bytes=msgspec.UNSET if max_output_bytes is None else max_output_bytes,
        env=msgspec.UNSET if env is None else dict(env),
        pass_env=msgspec.UNSET if pass_env is None else tuple(pass_env)))


def recorded_tool(name: str, output: str, *, description: str = "", parameters: Mapping[str, Any] | None = None,
                  needs_approval: bool = False, ask: InputSpec | None = None) -> Tool:
    """A tool whose every call returns ``output`` (demos, tests, replays).

    Raises:
        WorkflowInvalid: an invalid name or parameters.
    """
    return Tool(AgentToolSpec(name=name, description=description, parameters=_object(parameters),
                              recorded=RecordedToolSpec(output=output), needs_approval=needs_approval, input=ask))


def mcp_tools(*, command: Sequence[str] | None = None, url: str | None = None, name: str = "",
              env: Mapping[str, str] | None = None, pass_env: Sequence[str] | None = None,
              include: Sequence[str] = (), exclude: Sequence[str] = (),
              retry_safe: bool | Mapping[str, bool] | None = None, needs_approval: bool = False,
              timeout_s: float = 60.0, max_attempts: int = 1, fatal: bool = False,
              startup_timeout_s: float = 30.0) -> Tool:
    """Every tool an MCP server lists, as the YAML ``- {name: …, mcp: {…}}`` entry (docs/workflow.md "MCP tools").

    Args:
        command: a stdio server's argv (the executor starts it; no shell); url: a streamable-HTTP server's
            endpoint — exactly one.
        name: the prefix of the tools' names (``time`` → ``time__get_current_time``); empty: the command's last
            word, or the URL's host.
        env, pass_env: the stdio server's variables, and names passed through from the executor's environment.
        include, exclude: ``fnmatch`` patterns over the server's tool names.
        retry_safe: overrides the annotations (``readOnlyHint``/``idempotentHint``): for all, or by pattern.
        Others: as :func:`tool`, for every call of every tool of the server.

    Raises:
        WorkflowInvalid: not exactly one of ``command``/``url``, an invalid name, a ``REEL_NATS_*`` variable.
    """
    server = McpServerSpec(
        command=None if command is None else tuple(command), url=url,
        env=msgspec.UNSET if env is None else dict(env),
        pass_env=msgspec.UNSET if pass_env is None else tuple(pass_env), include=tuple(include),
        exclude=tuple(exclude), startup_timeout_s=startup_timeout_s,
        retry_safe=msgspec.UNSET if retry_safe is None else retry_safe if isinstance(retry_safe, bool)
        else dict(retry_safe))
    return Tool(AgentToolSpec(name=name, mcp=server, needs_approval=needs_approval, timeout_s=timeout_s,
                              max_attempts=max_attempts, fatal=fatal))


def resume_after(seconds: float, reason: str = "") -> ResumeAfter:
    """What a ``@reel.tool`` function returns to be run again later: ``return reel.resume_after(30, "not ready")``.

    The call's attempt is recorded ``attempt_failed`` with error kind ``resume_after`` (not a try: it never counts
    against ``max_attempts``); the run sleeps (status ``sleeping``, nothing holds it) until then, once nothing
    else of its turn can run, and the call is then run again with the same arguments (its ``attempt`` one
    higher). ``seconds``: in [0, a year and a day]; another value fails the call ``invalid_resume``
    (docs/workflow.md, "Sleep steps").
    """
    return ResumeAfter(seconds=seconds, reason=reason)


def ask_user(*, ask: InputSpec | None = None) -> Tool:
    """The built-in ``ask_user`` tool: the model asks a question and the run waits for a human's answer
    (``RunHandle.answer``); ``ask``: who is asked, the deadline (s) and what it decides."""
    return Tool(AgentToolSpec(name="ask_user", builtin="ask_user", input=ask))


def _object(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(parameters) if parameters is not None else {"type": "object", "properties": {}}


def args_struct(fn: Callable[..., Any]) -> type[msgspec.Struct]:
    """A ``msgspec.Struct`` with one field per parameter of ``fn`` (its hint, its default), without the
    parameters the executor fills in (:data:`INJECTED`).

    Raises:
        TypeError: ``fn`` takes ``*args``/``**kwargs``.
    """
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model; name each parameter")
        if p.name in INJECTED:
            continue
        hint = hints.get(p.name, Any)
        fields.append((p.name, hint) if p.default is p.empty else (p.name, hint, p.default))
    return msgspec.defstruct(re.sub(r"\W", "_", f"{fn.__name__}_arguments"), fields, kw_only=True,
                             forbid_unknown_fields=True)


def schema_of(fn: Callable[..., Any], args: type[msgspec.Struct] | None = None) -> dict[str, Any]:
    """The JSON Schema (an object) of ``fn``'s keyword arguments (``args``, default :func:`args_struct`), from
    its type hints (msgspec); unknown keys are refused (``additionalProperties: false``). An ``Args:`` entry of
    the docstring becomes the property's ``description``.

    Raises:
        TypeError: ``fn`` takes ``*args``/``**kwargs``, or a hint has no JSON Schema.
    """
    args = args or args_struct(fn)
    try:
        (ref,), components = msgspec.json.schema_components([args])
    except (TypeError, ValueError) as exc:
        raise TypeError(f"tool {fn.__name__}: a type hint has no JSON Schema: {exc}") from exc
    schema = dict(components.pop(str(ref["$ref"]).rsplit("/", 1)[-1]))
    schema.pop("title", None)
    schema.setdefault("properties", {})
    for prop, text in _arg_docs(fn).items():
        if prop in schema["properties"] and text:
            schema["properties"][prop] = {**schema["properties"][prop], "description": text}
    if components:  # nested Structs / enums the arguments refer to
        schema["$defs"] = components  # msgspec's refs read ``#/$defs/<name>``: this schema's own
    return schema


def _typed_call(fn: Callable[..., Any], args_type: type[msgspec.Struct]) -> Callable[..., Any]:
    """``fn`` called with its arguments converted to their hinted types (the injected ones passed as they are)."""
    def typed(kwargs: dict[str, Any]) -> dict[str, Any]:
        injected = {k: kwargs.pop(k) for k in INJECTED & kwargs.keys()}
        obj = msgspec.convert(kwargs, args_type)
        return {**{f: getattr(obj, f) for f in args_type.__struct_fields__}, **injected}

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def call_async(**kwargs: Any) -> Any:
            return await fn(**typed(kwargs))
        return call_async

    @functools.wraps(fn)
    def call(**kwargs: Any) -> Any:
        return fn(**typed(kwargs))
    return call


def _summary(fn: Callable[..., Any]) -> str:
    """The docstring's first paragraph, on one line."""
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _arg_docs(fn: Callable[..., Any]) -> dict[str, str]:
    """``name → text`` of the ``Args:`` section of a Google-style docstring (continuation lines joined)."""
    doc = inspect.getdoc(fn) or ""
    out: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in doc.splitlines():
        section = _SECTION.match(line)
        if section:
            in_args = section.group(1) in ("Args", "Arguments", "Parameters")
            current = None
            continue
        if not in_args:
            continue
        m = _ARG_LINE.match(line)
        if m:
            current = m.group(1).lstrip("*")
            out[current] = m.group(2).strip()
        elif current is not None and line.strip():
            out[current] = f"{out[current]} {line.strip()}".strip()
        elif not line.strip():
            current = None
    return out
