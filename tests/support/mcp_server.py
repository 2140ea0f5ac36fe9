"""A small MCP server of the tests' own, on the ``mcp`` SDK's ``MCPServer``: ``python -m tests.support.mcp_server``
serves it over stdio; :func:`server` is the same server for streamable HTTP (tests/integration/test_mcp_tools.py)."""

from __future__ import annotations

import os

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel


class Choice(BaseModel):
    color: str


def server() -> MCPServer:
    """``add`` (idempotent), ``explode`` (an isError result), ``pid`` (the server's process id), ``die`` (the
    server exits at once), ``paint`` (asks the user a colour: an elicitation), ``count`` (reports progress),
    ``hold`` (writes its pid to a file, then waits; at once when the file exists), ``was_cancelled`` (the holds
    the client cancelled with ``notifications/cancelled``)."""
    s = MCPServer("reel-test")
    cancelled: list[str] = []  # the markers of the holds whose call the client cancelled

    @s.tool(annotations=ToolAnnotations(idempotent_hint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @s.tool()
    def explode(why: str) -> str:
        """Always fails."""
        raise ToolError(f"exploded: {why}")

    @s.tool(annotations=ToolAnnotations(read_only_hint=True))
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @s.tool()
    def die() -> str:
        """The server exits at once, without answering."""
        os._exit(3)

    @s.tool()
    async def paint(thing: str, ctx: Context) -> str:
        """Paint a thing the colour the user chooses."""
        answer = await ctx.elicit(f"Which colour for the {thing}?", Choice)
        if answer.action != "accept":
            return f"the user declined ({answer.action})"
        return f"painted the {thing} {answer.data.color}"

    @s.tool()
    async def count(n: int, ctx: Context) -> str:
        """Count to n, reporting progress."""
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"at {i}")
        return f"counted to {n}"

    @s.tool()
    async def hold(marker: str, seconds: float = 600.0) -> str:
        """Write the server's pid to ``marker`` (a file, or a FIFO a test reads: the call has started), then wait
        ``seconds``; at once when a call with this ``marker`` held before (``<marker>.held`` exists)."""
        held = anyio.Path(marker + ".held")
        if await held.exists():
            return f"held before by {await held.read_text()}"
        await held.write_text(str(os.getpid()))
        await anyio.to_thread.run_sync(_write_pid, marker)  # a FIFO's open waits for its reader
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            cancelled.append(marker)
            raise
        return "held"

    @s.tool()
    def was_cancelled() -> str:
        """The markers of the holds the client cancelled."""
        return ",".join(cancelled) or "none"

    return s


def _write_pid(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))


if __name__ == "__main__":
    server().run("stdio")
