"""The MCP servers an executor's agents call tools of (docs/workflow.md "MCP tools"), on the official ``mcp`` SDK.

One :class:`McpServers` per event loop of the executor process (:func:`servers`) holds one connection per
distinct server (:meth:`~reel.shared.core.workflow.mcpspec.McpServerSpec.connection`), opened on first use:

* **stdio** (``command:``): the executor starts the command itself — no shell, in a process group of its
  own, with the environment of a ``command`` tool (:func:`~reel.shared.core.env.toolenv.spec_env`: the
  allow-list, the server's ``pass_env`` and ``env``, nothing else of the executor's), through
  :func:`~reel.shared.proc.reaper.child_setup` (it dies with the executor, kill -9 included, and is recorded
  for the next executor's reaper); it is started again on the next use after it died, and killed (its whole
  group) when the executor closes its servers.
* **streamable HTTP** (``url:``): one session, opened again on the next use after it broke.

:meth:`McpServers.expand` turns each ``mcp:`` entry of a workflow into the tools its server lists
(:func:`~reel.shared.core.workflow.agentspec.expand_mcp`; listed once per connection).
:meth:`McpServers.call` runs one attempt of one call (``tools/call``); its errors are
:class:`~reel.shared.core.errors.ToolError`\\ s of the kinds ``tool_error`` (a result with ``isError: true``),
``mcp_error`` (a JSON-RPC error), ``mcp_unavailable`` (not started or reached, or the connection broke) and
``timeout`` (the server is sent ``notifications/cancelled``) — docs/workflow.md "Tool errors" has every tool's
kinds, and whether each is retried.

A call cancelled (the run cancelled, the executor stopping) sends the server ``notifications/cancelled``
for it (the SDK's courtesy cancel) before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import os
import signal
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import msgspec
import structlog
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from reel.shared.core.env.toolenv import spec_env
from reel.shared.core.errors import ToolError, WorkflowInvalid
from reel.shared.core.workflow.agentspec import AgentToolSpec, expand_mcp
from reel.shared.core.workflow.mcpspec import ListedTool, McpServerSpec
from reel.shared.core.workflow.spec import AgentStep, WorkflowSpec
from reel.shared.proc import reaper

log = structlog.get_logger("reel.executor")

LINE_LIMIT_BYTES = 16 * 1024 * 1024
"""The longest JSON-RPC line a stdio server may print (bytes)."""
STDERR_KEEP_LINES = 20
"""How many of a stdio server's last stderr lines an error about it quotes."""
_CLOSE_GRACE_S = 2.0

Elicit = Callable[[str, dict[str, Any]], Awaitable[types.ElicitResult]]
"""Answers one elicitation of a call: ``await elicit(message, requested_schema)``."""


class _Server:
    """One connection to one server: its session, held by a task of its own until :meth:`close`."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.session: ClientSession | None = None
        self.listed: list[ListedTool] | None = None
        self.starts = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.stderr: collections.deque[str] = collections.deque(maxlen=STDERR_KEEP_LINES)
        self._holder: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lock = asyncio.Lock()
        self.asking: list[Elicit | None] = []
        """Who answers an elicitation, per call in flight on this connection (``None``: nobody)."""

    @property
    def alive(self) -> bool:
        if self.session is None or self._holder is None or self._holder.done():
            return False
        return self.proc is None or self.proc.returncode is None

    async def connect(self) -> ClientSession:
        """The live session, (re)started if there is none.

        Raises:
            ToolError: ``mcp_unavailable`` — it cannot be started, initialized, within ``startup_timeout_s``.
        """
        async with self._lock:
            if self.alive:
                assert self.session is not None
                return self.session
            await self._stop()
            self.starts += 1
            self._closing = asyncio.Event()
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._holder = asyncio.create_task(self._hold(ready), name=f"mcp {self.spec.label[:60]}")
            try:
                self.session = await asyncio.wait_for(asyncio.shield(ready), self.spec.startup_timeout_s)
            except TimeoutError:
                await self._stop()
                raise ToolError(f"mcp server {self.spec.label!r} did not start within "
                                f"{self.spec.startup_timeout_s:g} s{self._stderr_note()}",
                                kind="mcp_unavailable") from None
            except ToolError:
                await self._stop()
                raise
            log.info("mcp.started", server=self.spec.label[:200], starts=self.starts,
                     pid=None if self.proc is None else self.proc.pid)
            return self.session

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            async with self._streams() as (read, write), \
                    ClientSession(read, write, elicitation_callback=self._elicited) as session:
                await session.initialize()
                ready.set_result(session)
                await self._closing.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(ToolError(
                    f"mcp server {self.spec.label!r} did not start: {type(exc).__name__}: {exc}"
                    f"{self._stderr_note()}", kind="mcp_unavailable"))
            else:
                log.warning("mcp.connection_ended", server=self.spec.label[:200], error=repr(exc)[:300])
        finally:
            self.session = None

    async def _elicited(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        """An elicitation from the server: answered by its call's asker. The protocol does not say which call
        asks, so it must be the only call in flight on this connection; otherwise it is declined."""
        if len(self.asking) != 1 or self.asking[0] is None or not isinstance(params, types.ElicitRequestFormParams):
            log.warning("mcp.elicitation_declined", server=self.spec.label[:200], calls=len(self.asking))
            return types.ElicitResult(action="decline")
        return await self.asking[0](params.message, dict(params.requested_schema))

    def _stderr_note(self) -> str:
        return f" (its stderr ends: {' | '.join(self.stderr)[-2000:]})" if self.stderr else ""

    @contextlib.asynccontextmanager
    async def _streams(self) -> AsyncIterator[tuple[Any, Any]]:
        if self.spec.url is not None:
            async with streamable_http_client(self.spec.url) as (read, write, *_):
                yield read, write
            return
        assert self.spec.command is not None
        records = reaper.registry()
        if records is not None:
            records.mkdir(parents=True, exist_ok=True)
        env = spec_env(os.environ, self.spec, {})
        proc = self.proc = await asyncio.create_subprocess_exec(
            *self.spec.command, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=LINE_LIMIT_BYTES, start_new_session=True,
            preexec_fn=functools.partial(reaper.child_setup, os.getpid(), records))
        read_w, read_r = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_w, write_r = anyio.create_memory_object_stream[SessionMessage](0)

        async def stdout() -> None:
            assert proc.stdout is not None
            async with read_w:
                while line := await proc.stdout.readline():
                    if not line.strip():
                        continue
                    try:
                        msg: SessionMessage | Exception = SessionMessage(
                            types.jsonrpc_message_adapter.validate_json(line, by_name=False))
                    except ValueError as exc:
                        msg = exc
                    await read_w.send(msg)

        async def stdin() -> None:
            assert proc.stdin is not None
            async with write_r:
                async for m in write_r:
                    proc.stdin.write(m.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")
                    await proc.stdin.drain()

        async def stderr() -> None:
            assert proc.stderr is not None
            while line := await proc.stderr.readline():
                self.stderr.append(line.decode(errors="replace").rstrip()[:500])

        try:
            async with anyio.create_task_group() as tg:
                for pump in (stdout, stdin, stderr):
                    tg.start_soon(pump)
                try:
                    yield read_r, write_w
                finally:
                    tg.cancel_scope.cancel()
        finally:
            _kill(proc, records)

    async def _stop(self) -> None:
        self._closing.set()
        holder, self._holder = self._holder, None
        if holder is not None and not holder.done():
            try:
                await asyncio.wait_for(asyncio.shield(holder), _CLOSE_GRACE_S)
            except (TimeoutError, Exception):
                holder.cancel()
                with contextlib.suppress(BaseException):
                    await holder
        if self.proc is not None:
            _kill(self.proc, reaper.registry())
            self.proc = None
        self.session = None

    async def close(self) -> None:
        async with self._lock:
            await self._stop()


def _kill(proc: asyncio.subprocess.Process, records: Any) -> None:
    """SIGKILL ``proc``'s whole group (the server and whatever it started) and forget its registry record."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    reaper.forget(records, proc.pid)


def _listed(tool: types.Tool) -> ListedTool:
    a = tool.annotations
    return ListedTool(name=tool.name, description=tool.description or "", input_schema=dict(tool.input_schema),
                      read_only=None if a is None else a.read_only_hint,
                      idempotent=None if a is None else a.idempotent_hint)


def result_text(result: types.CallToolResult) -> str:
    """A ``tools/call`` result as the observation text: its text blocks, each other block as JSON, one per
    line; no content: its ``structuredContent`` as JSON."""
    parts = [b.text if isinstance(b, types.TextContent) else b.model_dump_json(by_alias=True, exclude_none=True)
             for b in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


class McpServers:
    """The MCP connections of one executor (one event loop): see the module docstring."""

    def __init__(self) -> None:
        self._servers: dict[bytes, _Server] = {}
        self._expanded: dict[int, tuple[WorkflowSpec, WorkflowSpec]] = {}

    def server(self, spec: McpServerSpec) -> _Server:
        """The connection of ``spec`` (made, not yet opened, on first use)."""
        key = spec.connection()
        if key not in self._servers:
            self._servers[key] = _Server(spec)
        return self._servers[key]

    async def listed(self, spec: McpServerSpec) -> list[ListedTool]:
        """The server's tools (``tools/list``, every page; listed once per connection)."""
        server = self.server(spec)
        if server.listed is None:
            session = await server.connect()
            tools: list[ListedTool] = []
            cursor: str | None = None
            try:
                while True:
                    page = await session.list_tools(
                        params=None if cursor is None else types.PaginatedRequestParams(cursor=cursor))
                    tools += [_listed(t) for t in page.tools]
                    cursor = page.next_cursor
                    if not cursor:
                        break
            except MCPError as exc:
                raise ToolError(f"mcp server {spec.label!r} refused tools/list: {exc.message}",
                                kind="mcp_unavailable") from None
            server.listed = tools
        return server.listed

    async def expand(self, spec: WorkflowSpec) -> WorkflowSpec:
        """``spec`` with each ``mcp:`` entry of its agent steps replaced by the tools its server lists (the same
        object when it has none).

        Raises:
            WorkflowInvalid: a server cannot be started or listed, or a listed tool's name is another tool's
                (naming the entry's field path).
        """
        cached = self._expanded.get(id(spec))
        if cached is not None and cached[0] is spec:
            return cached[1]
        if not any(t.type == "mcp" for s in spec.steps if isinstance(s, AgentStep) for t in s.tools):
            return spec
        steps = list(spec.steps)
        for i, step in enumerate(steps):
            if not isinstance(step, AgentStep) or not any(t.type == "mcp" for t in step.tools):
                continue
            tools: list[AgentToolSpec] = []
            for j, entry in enumerate(step.tools):
                if not isinstance(entry.mcp, McpServerSpec):
                    tools.append(entry)
                    continue
                try:
                    listed = await self.listed(entry.mcp)
                except ToolError as exc:
                    raise WorkflowInvalid(f"{exc.message} (at `$.steps[{i}].tools[{j}].mcp`)") from None
                tools += expand_mcp(entry, listed)
            names = [t.name for t in tools]
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup is not None:
                raise WorkflowInvalid(f"duplicate tool name {dup!r}: an mcp server lists a tool of that name"
                                      f" (at `$.steps[{i}].tools`)")
            steps[i] = msgspec.structs.replace(step, tools=tuple(tools))
        out = msgspec.structs.replace(spec, steps=tuple(steps))
        if len(self._expanded) > 256:
            self._expanded.clear()
        self._expanded[id(spec)] = (spec, out)
        return out

    async def call(self, tool: AgentToolSpec, arguments: dict[str, Any],
                   on_progress: Callable[[float, float | None, str | None], Any] | None = None,
                   on_elicit: Elicit | None = None) -> str:
        """One attempt of a call of the listed tool ``tool`` with ``arguments``; its observation text.
        ``on_elicit`` answers the server's elicitations during the call (without it they are declined).

        Raises:
            ToolError: of the module docstring's kinds.
        """
        assert isinstance(tool.mcp, McpServerSpec) and isinstance(tool.mcp_tool, str)
        server = self.server(tool.mcp)
        session = await server.connect()

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            if on_progress is not None:
                with contextlib.suppress(Exception):
                    await on_progress(progress, total, message)

        server.asking.append(on_elicit)
        try:
            async with asyncio.timeout(tool.timeout_s):
                result = await session.call_tool(tool.mcp_tool, arguments, progress_callback=progress)
        except TimeoutError:
            raise ToolError(f"{tool.name} did not return within {tool.timeout_s:g} s (the server was sent"
                            f" notifications/cancelled)", kind="timeout") from None
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED or not server.alive:
                server.session = None  # the next call starts it again
                raise ToolError(f"{tool.name}: the connection to mcp server {tool.mcp.label!r} ended: "
                                f"{exc.message}{server._stderr_note()}", kind="mcp_unavailable") from None
            raise ToolError(f"{tool.name}: mcp error {exc.code}: {exc.message}", kind="mcp_error",
                            retryable=False) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            server.session = None
            raise ToolError(f"{tool.name}: the connection to mcp server {tool.mcp.label!r} broke: "
                            f"{type(exc).__name__}: {exc}", kind="mcp_unavailable") from None
        finally:
            server.asking.remove(on_elicit)
        if not isinstance(result, types.CallToolResult):
            raise ToolError(f"{tool.name}: the server answered with {type(result).__name__}, not a tool result",
                            kind="mcp_error", retryable=False)
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"{tool.name} returned an error result", kind="tool_error", retryable=False)
        return text

    async def close(self) -> None:
        """Close every connection (a stdio server's group is killed)."""
        servers, self._servers = list(self._servers.values()), {}
        for s in servers:
            with contextlib.suppress(Exception):
                await s.close()


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, McpServers] = weakref.WeakKeyDictionary()


def servers() -> McpServers:
    """The running event loop's :class:`McpServers` (made on first use)."""
    loop = asyncio.get_running_loop()
    found = _BY_LOOP.get(loop)
    if found is None:
        found = _BY_LOOP[loop] = McpServers()
    return found


async def close_servers() -> None:
    """Close the running loop's MCP connections (the executor is stopping); a no-op when none were opened."""
    found = _BY_LOOP.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.close()
