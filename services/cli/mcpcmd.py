"""``reel mcp``: serve Reel to MCP clients (an IDE's agent, a desktop assistant) over stdio or streamable HTTP.

The server is :mod:`reel.services.cli.mcpserver`; this is its command: one ``reel`` session (the ``client`` role
with ``--auth``), no services of its own — the runs it starts are run by a ``reel up`` (or ``reel serve …``)
beside it. Only MCP speaks on stdout; every line of ours goes to stderr.
"""

from __future__ import annotations

import socket
from pathlib import Path

import typer

from reel.services.cli.console import CliError, Namespace, NatsUrl, err_console, run_async
from reel.services.cli.embed import session


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise typer.BadParameter(f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def mcp(
    http: str | None = typer.Option(None, "--http", metavar="HOST:PORT",
                                    help="serve streamable HTTP on HOST:PORT (path /mcp; port 0: any free one, "
                                         "printed) instead of stdio"),
    workflows: list[Path] | None = typer.Option(None, "--workflows", metavar="DIR",
                                                help="a folder of workflow files the server lists and starts "
                                                     "(repeatable; default: the current one)"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Serve Reel as an MCP server: tools to list and start workflows, follow a run, read its timeline and
    verdicts, answer its input requests, rewind and cancel it (docs/integrations.md)."""
    address = _host_port(http) if http is not None else None
    from reel._client import Client

    async def body() -> int:
        try:  # in the body: run_async prints the refusal as one error line
            from reel.services.cli import mcpserver
        except ImportError as exc:
            raise CliError(f"reel mcp needs the mcp package: pip install 'reel[mcp]' ({exc})") from None
        async with session(nats_url, namespace, services=(), client_only=True) as s:  # no operator login
            if s.embedded:
                raise CliError("no Reel server is running: start `reel up` (or pass --nats-url): reel mcp only "
                               "connects, it runs no executor", kind="unavailable")
            client = Client(s.infra.nc, s.cfg, s.infra, owns_connection=False)
            server = mcpserver.build(s.client, client, mcpserver.WorkflowRoots(workflows or [Path.cwd()]),
                                     workflow_of=s.workflow)
            if address is None:
                await server.run_stdio_async()
                return 0
            import uvicorn

            host, port = address
            try:
                sock = socket.create_server((host, port))
            except OSError as exc:
                raise CliError(f"--http {host}:{port}: cannot listen: {exc.strerror or exc}") from None
            with sock:
                url = f"http://{host}:{sock.getsockname()[1]}/mcp"
                app = server.streamable_http_app(host=host)
                err_console.print(f"reel mcp: streamable HTTP on {url}", markup=False)  # listening already
                await uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock])
        return 0

    run_async(body())
