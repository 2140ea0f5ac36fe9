"""``reel serve <service>``: run one instance of a Reel service in the foreground (scale by running more)."""

from __future__ import annotations

import os

import typer

from reel.services.cli.console import Namespace, err_console
from reel.services.cli.embed import SERVICES, service_serve

ServeUrl = typer.Option(None, "--nats-url", envvar="NATS_URL", help="NATS server URL (default nats://127.0.0.1:4222)")

serve_app = typer.Typer(help="Run one instance of a Reel service (scale by running more).", no_args_is_help=True)


def _service_command(name: str) -> None:
    def cmd(nats_url: str | None = ServeUrl, namespace: str = Namespace) -> None:
        if nats_url is not None:  # the service reads its connection from the environment (reel.shared.runtime.config)
            os.environ["NATS_URL"] = nats_url
        os.environ["REEL_NAMESPACE"] = namespace
        serve = service_serve(name)
        if serve is None:
            err_console.print(f"[red]error:[/] service {name} is not installed")
            raise typer.Exit(1)
        from reel.services.runtime.runner import main_for

        main_for(name, serve)

    cmd.__doc__ = (f"Run one {name} instance on --nats-url (default $NATS_URL, else nats://127.0.0.1:4222) in "
                   f"--namespace (see docs/architecture.md).")
    serve_app.command(name)(cmd)


for _name in (*SERVICES, "retention"):  # retention: not among reel up's, it needs a policy (docs/operations.md)
    _service_command(_name)
