"""What environment a tool process starts with: an allow-list, never the caller's whole environment.

Every process Reel starts for a workflow or a session — a ``command`` tool step, an agent's
``command`` tool, a ``command`` verifier, crucible's judge, proposer and park probe — gets
exactly (:func:`tool_env`, later entries win):

1. the variables of :data:`BASE_ENV_KEYS` present in the starting process's environment;
2. the variables the tool's ``pass_env: [NAME, …]`` names, from that same environment (a name
   that is unset there is left out, not an error: the tool sees it unset);
3. the tool's ``env: {NAME: value}`` (values were already expanded from ``${VAR}`` of whoever
   started the run, when the workflow was loaded: shared/core/env/interpolate.py);
4. the variables Reel itself defines for the tool (``REEL_RUN_ID``, ``REEL_STEP_ID``,
   ``REEL_ATTEMPT``, ``REEL_IDEMPOTENCY_KEY``, ``REEL_TOOL_ARGS``…): a spec cannot override them.

Nothing else crosses: not the executor's NATS credentials (``REEL_NATS_*``), not a model's API
key (``api_key_env``), not a cloud credentials file's path. A name of :data:`REFUSED_PREFIXES`
in ``env`` or ``pass_env`` is refused at load (:func:`check_tool_env`): those variables are the
service's own identity, and a tool that holds them can act as the service.

Pure: the environment is an argument, never read here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec

from reel.shared.core.errors import WorkflowInvalid

BASE_ENV_KEYS: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")
"""Inherited by every tool process when set (``SYSTEMROOT``: Windows needs it to start a program)."""
REFUSED_PREFIXES: tuple[str, ...] = ("REEL_NATS_",)
"""Names no tool may be given (``env``) or passed (``pass_env``): the services' NATS credentials."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""What a variable name may look like (POSIX portable names)."""


class EnvDeclared(Protocol):
    """A spec that declares its process's ``env`` and ``pass_env`` (unset: none): a tool step's
    :class:`~reel.shared.core.workflow.toolspec.ToolSpec`, an agent's
    :class:`~reel.shared.core.workflow.agentspec.AgentToolSpec`,
    a :class:`~reel.shared.core.verify.verifierspec.VerifierSpec`."""

    @property
    def env(self) -> dict[str, str] | msgspec.UnsetType: ...

    @property
    def pass_env(self) -> tuple[str, ...] | msgspec.UnsetType: ...


def declared(spec: EnvDeclared) -> tuple[dict[str, str], tuple[str, ...]]:
    """``spec``'s ``env`` and ``pass_env``, empty when unset."""
    env = {} if isinstance(spec.env, msgspec.UnsetType) else spec.env
    return env, () if isinstance(spec.pass_env, msgspec.UnsetType) else spec.pass_env


def check_process_env(spec: EnvDeclared, runs_process: bool, where: str) -> None:
    """:func:`check_tool_env` of ``spec``'s own fields (``where``: the spec's field path); ``runs_process``:
    whether the spec starts a process at all (``env``/``pass_env`` on one that does not is refused: a
    ``python`` tool runs inside the executor and reads its environment, not one of its own).

    Raises:
        WorkflowInvalid: see :func:`check_tool_env`; or ``env``/``pass_env`` given where no process starts.
    """
    env, pass_env = declared(spec)
    if not runs_process and (env or pass_env):
        field = "env" if env else "pass_env"
        raise WorkflowInvalid(f"`{field}` applies only to a tool that runs a command (a python tool runs inside"
                              f" the executor; a recorded or scripted one runs nothing) (at `{where}.{field}`)")
    check_tool_env(env, pass_env, where)


def spec_env(inherited: Mapping[str, str], spec: EnvDeclared, reel: Mapping[str, str]) -> dict[str, str]:
    """:func:`tool_env` of ``spec``'s declared fields: the whole environment of its process."""
    env, pass_env = declared(spec)
    return tool_env(inherited, env=env, pass_env=pass_env, reel=reel)


def refused(name: str) -> bool:
    """Whether ``name`` is one no tool may see (:data:`REFUSED_PREFIXES`)."""
    return name.startswith(REFUSED_PREFIXES)


def check_tool_env(env: Mapping[str, str], pass_env: Sequence[str], where: str) -> None:
    """The load-time checks of a tool's ``env`` and ``pass_env``.

    Args:
        where: the field path of the tool (``$.steps[2].tool``), for the message.

    Raises:
        WorkflowInvalid: naming the field, e.g. ``pass_env may not name REEL_NATS_PASSWORD: … (at
            `$.steps[0].tool.pass_env[1]`)`` — a refused name, a malformed name, or a value with a NUL byte.
    """
    for i, name in enumerate(pass_env):
        _check_name(name, "pass_env", f"{where}.pass_env[{i}]")
    for name, value in env.items():
        _check_name(name, "env", f"{where}.env.{name}")
        if "\x00" in value:
            raise WorkflowInvalid(f"env value of {name} holds a NUL byte, which no environment can carry"
                                  f" (at `{where}.env.{name}`)")


def _check_name(name: str, field: str, at: str) -> None:
    if not ENV_NAME.match(name):
        raise WorkflowInvalid(f"{field} name {name!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*) (at `{at}`)")
    if refused(name):
        raise WorkflowInvalid(f"{field} may not name {name}: REEL_NATS_* hold the services' NATS credentials,"
                              f" and a tool that sees them can act as the executor (at `{at}`)")


def tool_env(inherited: Mapping[str, str], *, env: Mapping[str, str] | None = None, pass_env: Sequence[str] = (),
             reel: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of one tool process (see module doc for the order).

    Args:
        inherited: the starting process's environment (the executor's ``os.environ``).
        env: the tool's ``env`` (set as given); pass_env: the names taken from ``inherited``.
        reel: the variables Reel defines for this call (they win over ``env``).

    A refused name (:func:`refused`) is dropped even if a caller that skipped :func:`check_tool_env` gave it.
    """
    out = {k: inherited[k] for k in BASE_ENV_KEYS if k in inherited}
    out.update({k: inherited[k] for k in pass_env if k in inherited})
    out.update(env or {})
    out.update(reel or {})
    return {k: v for k, v in out.items() if not refused(k)}
