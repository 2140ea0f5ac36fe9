"""``reel serve <service>``: run one instance of a Reel service in the foreground (scale by running more)."""

from __future__ import annotations

import typer

from services.cli.common import err_console
from services.cli.embed import SERVICES, service_serve

serve_app = typer.Typer(help="Run one instance of a Reel service (scale by running more).", no_args_is_help=True)


def _service_command(name: str) -> None:
    def cmd() -> None:
        serve = service_serve(name)
        if serve is None:
            err_console.print(f"[red]error:[/] service {name} is not installed")
            raise typer.Exit(1)
        from services.runner import main_for

        main_for(name, serve)

    cmd.__doc__ = f"Run one {name} instance (env: NATS_URL, REEL_NAMESPACE; see docs/architecture.md)."
    serve_app.command(name)(cmd)


for _name in SERVICES:
    _service_command(_name)
