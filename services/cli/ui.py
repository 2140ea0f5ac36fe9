"""``reel ui``: serve the read-only web UI (docs/ui.md) over the connection every command uses."""

from __future__ import annotations

import asyncio
from typing import Any

import typer

from reel.services.cli.console import CliError, Namespace, NatsUrl, console, run_async
from reel.services.cli.embed import session
from reel.services.ui.pages import MAX_PAGE_BYTES, PAGE_BYTES
from reel.shared.nats.access import redact_url


def ui(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8765, "--port", help="TCP port to listen on (0: a free one, printed)"),
    page_bytes: int = typer.Option(PAGE_BYTES, "--page-bytes", min=1, max=MAX_PAGE_BYTES,
                                   help="bytes per page of a prompt/output viewer"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Serve a read-only web UI of the runs: the runs page, each run's lineage, timeline, partitions, prompts,
    outputs and verdicts, live while runs move. Connects like every command — with an auth directory as its
    read-only viewer role, which may send no command — and never sends a command. Ctrl-C stops it."""
    from reel.services.ui.app import create_app, serve  # the web stack is imported by `reel ui` only
    from reel.services.ui.reader import RunReader

    async def body() -> int:
        async with session(nats_url, namespace, services=(), role="viewer") as s:
            app = create_app(RunReader(s.client), page_bytes=page_bytes, server=redact_url(s.cfg.nats_url))
            started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(serve(app, host, port, started=started))
            first: list[asyncio.Future[Any]] = [task, started]
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            if started.done():
                console.print(f"reel ui: {started.result()}  (NATS {redact_url(s.cfg.nats_url)}, namespace "
                              f"{namespace}{', embedded' if s.embedded else ''}; read-only; Ctrl-C stops)",
                              markup=False, highlight=False, soft_wrap=True)
            try:
                await task
            except OSError as exc:
                raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        return 0

    run_async(body())
