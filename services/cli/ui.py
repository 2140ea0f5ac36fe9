"""``reel ui``: serve the web UI (docs/ui.md) over the connection every command uses: read-only unless
``--allow-actions``."""

from __future__ import annotations

import asyncio
import getpass
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
    allow_actions: bool = typer.Option(False, "--allow-actions",
                                       help="render approve/reject/answer, cancel and rewind forms and send them "
                                            "(as the client role with --auth; off: read-only, every action 403)"),
    operator: str | None = typer.Option(None, "--operator", metavar="WHO",
                                        help="who the actions are recorded as (default: your user name)"),
    allowed_host: list[str] = typer.Option([], "--allowed-host", metavar="NAME",
                                           help="a further Host name an action post may carry (repeatable; e.g. a "
                                                "proxy's name)"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Serve a web UI of the runs: the runs page, each run's lineage, timeline, partitions, prompts, outputs and
    verdicts, live while runs move. Read-only by default: connects like every command — with an auth directory
    as its viewer role, which may send no command — and sends none. With --allow-actions an operator can
    approve, reject, answer, cancel and rewind from the pages, each sent as the CLI sends it and recorded with
    --operator as who; with an auth directory it then connects as the client role. Ctrl-C stops it."""
    from reel.services.ui.actions import Actions
    from reel.services.ui.app import create_app, serve  # the web stack is imported by `reel ui` only
    from reel.services.ui.forms import allowed_hosts
    from reel.services.ui.reader import RunReader

    who = (operator if operator is not None else _user()).strip()
    if allow_actions and not who:
        raise typer.BadParameter("--operator must name who acts (it is recorded with every action)")

    async def body() -> int:
        async with session(nats_url, namespace, services=(), role="client" if allow_actions else "viewer") as s:
            actions = Actions(s.client, who) if allow_actions else None
            reader = RunReader(s.client)
            app = create_app(reader, page_bytes=page_bytes, server=redact_url(s.cfg.nats_url),
                             actions=actions, hosts=allowed_hosts(host, allowed_host))
            started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(serve(app, host, port, started=started))
            first: list[asyncio.Future[Any]] = [task, started]
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            if started.done():
                console.print(f"reel ui: {started.result()}  (NATS {redact_url(s.cfg.nats_url)}, namespace "
                              f"{namespace}{', embedded' if s.embedded else ''}; "
                              f"{f'actions allowed, as {who}' if allow_actions else 'read-only'}; Ctrl-C stops)",
                              markup=False, highlight=False, soft_wrap=True)
            try:
                async with reader.indexing():  # the runs page's index, built from the stream and following it
                    await task
            except OSError as exc:
                raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        return 0

    run_async(body())


def _user() -> str:
    """The OS user's name (``""`` if it cannot be told)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""
