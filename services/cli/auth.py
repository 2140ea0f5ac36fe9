"""Credentials on the ``reel`` CLI: the connection options every command takes, and ``reel auth init``.

The options go before the command (``reel --nats-user client run wf.yaml``) and each
has its environment variable (``REEL_NATS_USER``, … — :data:`reel.shared.runtime.config.CONNECTION_FLAGS`);
a flag sets its variable for the command, so every connection it opens and every
service it runs reads it (docs/security.md). ``--auth DIR`` (``REEL_AUTH_DIR``) names a
``reel auth init`` directory: the command connects as its ``client`` role unless other
credentials are given, an embedded server runs with its accounts, and services run
in-process connect as their roles.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from reel.services.cli.console import CliError, Namespace, console, reel_home, run_async
from reel.shared.auth.authdir import AuthDir, AuthDirExists, init
from reel.shared.auth.roles import ROLES
from reel.shared.core.wire.subjects import Names
from reel.shared.runtime.config import CONNECTION_FLAGS, Config

AUTH_DIR_ENV = "REEL_AUTH_DIR"

auth_app = typer.Typer(help="NATS users, roles and permissions (docs/security.md).", no_args_is_help=True)


def auth_dir_from_env() -> AuthDir | None:
    """The ``reel auth init`` directory of ``$REEL_AUTH_DIR`` (``--auth``), if set.

    Raises:
        CliError: it is set but holds no ``auth.conf``.
    """
    value = os.environ.get(AUTH_DIR_ENV)
    if not value:
        return None
    d = AuthDir(Path(value))
    if not d.exists():
        raise CliError(f"{value} is not a `reel auth init` directory (no auth.conf): run `reel auth init {value}`")
    return d


def default_auth_dir() -> Path:
    """The directory ``reel auth init`` writes and ``reel up --auth`` reads without ``$REEL_AUTH_DIR``:
    ``$REEL_HOME/auth`` (``.reel/auth``)."""
    return reel_home() / "auth"


def _opt(flag: str) -> Any:
    env, text = CONNECTION_FLAGS[flag]
    return typer.Option(None, flag, envvar=env, help=text, show_envvar=True)


def connection_options(
    nats_url: str | None = typer.Option(None, "--nats-url", envvar="NATS_URL", show_envvar=True,
                                        help="NATS server URL (as each command's --nats-url; default: embedded)"),
    namespace: str | None = typer.Option(None, "--namespace", envvar="REEL_NAMESPACE", show_envvar=True,
                                         help="subject/stream namespace (as each command's --namespace)"),
    auth: Path | None = typer.Option(None, "--auth", envvar=AUTH_DIR_ENV, metavar="DIR", show_envvar=True,
                                     help="a `reel auth init` directory: connect as its roles (docs/security.md)"),
    nats_user: str | None = _opt("--nats-user"),
    nats_password: str | None = _opt("--nats-password"),
    nats_password_file: str | None = _opt("--nats-password-file"),
    nats_creds: str | None = _opt("--nats-creds"),
    nats_nkey_seed: str | None = _opt("--nats-nkey-seed"),
    nats_tls_ca: str | None = _opt("--nats-tls-ca"),
    nats_tls_cert: str | None = _opt("--nats-tls-cert"),
    nats_tls_key: str | None = _opt("--nats-tls-key"),
    nats_js_api_prefix: str | None = _opt("--nats-js-api-prefix"),
    nats_inbox_prefix: str | None = _opt("--nats-inbox-prefix"),
) -> None:
    """Connection options of every command (given before the command): the server, the namespace, credentials,
    TLS, an auth directory. ``--nats-url`` / ``--namespace`` may also follow the command."""
    for env, value in {"NATS_URL": nats_url, "REEL_NAMESPACE": namespace}.items():
        if value is not None:
            os.environ[env] = value  # the command's own option reads it (its envvar), unless given there too
    values = {"--nats-user": nats_user, "--nats-password": nats_password, "--nats-password-file": nats_password_file,
              "--nats-creds": nats_creds, "--nats-nkey-seed": nats_nkey_seed, "--nats-tls-ca": nats_tls_ca,
              "--nats-tls-cert": nats_tls_cert, "--nats-tls-key": nats_tls_key,
              "--nats-js-api-prefix": nats_js_api_prefix, "--nats-inbox-prefix": nats_inbox_prefix}
    for flag, value in values.items():
        if value is not None:
            os.environ[CONNECTION_FLAGS[flag][0]] = value
    if auth is not None:
        os.environ[AUTH_DIR_ENV] = str(auth)


def install(app: typer.Typer) -> None:
    """Register the connection options (the app's callback) and ``reel auth`` on ``app``."""
    app.callback()(connection_options)
    app.add_typer(auth_app, name="auth")


@auth_app.command("init")
def init_cmd(
    directory: Path | None = typer.Argument(None, help="where to write auth.conf, server.conf and the role "
                                            "credentials (default $REEL_HOME/auth: the one `reel up --auth` uses)"),
    namespace: str = Namespace,
    force: bool = typer.Option(False, "--force", help="replace an existing directory's passwords"),
    if_missing: bool = typer.Option(False, "--if-missing", help="do nothing (exit 0) if DIR already has auth.conf"),
    k8s: bool = typer.Option(False, "--k8s", help="also write k8s-secrets.yaml (Secrets reel-nats-auth, reel-<role>)"),
) -> None:
    """Write a nats-server authorization config and a random password per role (files 0600)."""
    directory = directory if directory is not None else default_auth_dir()

    async def body() -> int:
        if if_missing and AuthDir(directory).exists():
            console.print(f"{directory}: auth.conf exists; nothing written")
            return 0
        try:
            d = init(directory, Names(namespace, Config.from_env().names.partitions), force=force, k8s=k8s)
        except AuthDirExists as exc:
            raise CliError(str(exc)) from None
        console.print(f"wrote {d.auth_conf} (include it from the server config), {d.server_conf}, and "
                      f"<role>.env / <role>.password for {', '.join(ROLES)}" + (" and k8s-secrets.yaml" if k8s else ""))
        console.print(f"clients: `reel --auth {directory} …`, or `set -a; . {directory}/client.env; set +a`")
        return 0

    run_async(body())
