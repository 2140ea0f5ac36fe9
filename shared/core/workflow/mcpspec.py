"""An agent's tools from an MCP server: the ``mcp:`` entry of a ``tools:`` list and its expansion (pure).

An entry ``- {name: time, mcp: {command: [mcp-server-time]}}`` (stdio: the executor starts the command) or
``- {name: docs, mcp: {url: "http://…/mcp"}}`` (streamable HTTP) stands for every tool the server lists
(``tools/list``). The executor lists them once per server and turns each into an
:class:`~reel.shared.core.workflow.agentspec.AgentToolSpec` (:func:`expand`): its name is the entry's name,
``__`` and the server's name of the tool (``time__get_current_time``; characters a chat-completions function
name cannot hold become ``_``, and a name past 64 characters is cut and ends in 8 hex digits of its sha256);
its description and ``parameters`` are the server's; ``retry_safe`` is the server's annotations
(``readOnlyHint`` or ``idempotentHint``) unless the entry's ``retry_safe`` says otherwise; the entry's
``timeout_s``, ``max_attempts``, ``fatal``, ``needs_approval``, ``input``, ``max_output_bytes`` and
``on_overflow`` apply to each.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from typing import Any

import msgspec

from reel.shared.core.env.toolenv import check_process_env
from reel.shared.core.errors import WorkflowInvalid

PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
"""What an ``mcp:`` entry's name (the prefix of its tools' names) may look like."""
SEPARATOR = "__"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class McpServerSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One MCP server an agent's tools come from. Exactly one of ``command`` or ``url``.

    Attributes:
        command: argv of a stdio server (no shell); the executor starts it once and keeps it.
        url: the endpoint of a streamable-HTTP server (``http://`` or ``https://``).
        env, pass_env: the stdio server's own variables and the names passed through from the executor's
            environment, as for a ``command`` tool (:mod:`reel.shared.core.env.toolenv`).
        include, exclude: ``fnmatch`` patterns over the server's tool names: only those ``include`` names
            (empty: all), then none that ``exclude`` names.
        retry_safe: overrides the annotations' default: ``true``/``false`` for every tool, or
            ``{pattern: bool}`` by the server's tool name (the first matching pattern wins).
        startup_timeout_s: how long starting, initializing and listing may take (s).
    """

    command: tuple[str, ...] | None = None
    url: str | None = None
    env: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    pass_env: tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    retry_safe: bool | dict[str, bool] | msgspec.UnsetType = msgspec.UNSET
    startup_timeout_s: float = 30.0

    @property
    def label(self) -> str:
        """What names the server in messages: its argv, or its URL."""
        return " ".join(self.command) if self.command is not None else self.url or "?"

    def connection(self) -> bytes:
        """The server's identity in an executor (one process or session per distinct value): how it is reached,
        not which of its tools are used."""
        return msgspec.json.encode(msgspec.structs.replace(self, include=(), exclude=(), retry_safe=msgspec.UNSET))

    def offers(self, tool_name: str) -> bool:
        """Whether the filters keep the server's tool ``tool_name``."""
        if self.include and not any(fnmatch.fnmatchcase(tool_name, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(tool_name, p) for p in self.exclude)

    def retry_safe_of(self, tool_name: str, hinted: bool) -> bool:
        """``retry_safe`` of the server's tool ``tool_name``: the override, else ``hinted`` (the annotations')."""
        if isinstance(self.retry_safe, bool):
            return self.retry_safe
        if isinstance(self.retry_safe, dict):
            for pattern, safe in self.retry_safe.items():
                if fnmatch.fnmatchcase(tool_name, pattern):
                    return safe
        return hinted


class ListedTool(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a server's ``tools/list``, as the expansion reads it.

    Attributes:
        name: the server's name of the tool; description: its description.
        input_schema: its ``inputSchema`` (JSON Schema of the arguments object).
        read_only, idempotent: its annotations ``readOnlyHint`` / ``idempotentHint`` (``None``: not given).
    """

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    read_only: bool | None = None
    idempotent: bool | None = None

    @property
    def hinted_retry_safe(self) -> bool:
        """Running it again does what running it once does, by its annotations (read-only or idempotent)."""
        return bool(self.read_only) or bool(self.idempotent)


def tool_name(prefix: str, name: str) -> str:
    """The name the model sees for the server tool ``name`` of the entry ``prefix`` (``[A-Za-z0-9_-]{1,64}``)."""
    full = f"{prefix}{SEPARATOR}{_UNSAFE.sub('_', name)}"
    if len(full) <= 64:
        return full
    return full[:55] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]


def default_prefix(server: McpServerSpec) -> str:
    """The prefix of an entry without a ``name``: its command's last word (``mcp_server_time`` for
    ``[python, -m, mcp_server_time]``), or its URL's host; ``[A-Za-z0-9_-]``, at most 40 characters."""
    if server.command:
        word = server.command[-1].rstrip("/").rsplit("/", 1)[-1]
    else:
        word = (server.url or "mcp").split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    return _UNSAFE.sub("_", word)[:40] or "mcp"


def check_server(server: McpServerSpec, at: str) -> None:
    """The load-time checks of an ``mcp:`` entry's server at field path ``at`` (``$.steps[0].tools[1].mcp``).

    Raises:
        WorkflowInvalid: naming the field of the first problem.
    """
    if (server.command is None) == (server.url is None):
        raise WorkflowInvalid(f"an mcp server needs exactly one of `command` (stdio) or `url` (streamable HTTP)"
                              f" (at `{at}`)")
    if server.command is not None and not server.command:
        raise WorkflowInvalid(f"an mcp server's command needs a non-empty argv (at `{at}.command`)")
    if server.url is not None and not server.url.startswith(("http://", "https://")):
        raise WorkflowInvalid(f"an mcp server's url must start with http:// or https://, got {server.url[:80]!r}"
                              f" (at `{at}.url`)")
    if server.startup_timeout_s <= 0:
        raise WorkflowInvalid(f"startup_timeout_s must be > 0 (at `{at}.startup_timeout_s`)")
    check_process_env(server, server.command is not None, at)
