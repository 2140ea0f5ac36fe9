"""``reel up``: the embedded nats-server (unless ``--nats-url``) and every service as supervised children.

Each service instance is ``python -m services.<name>``; one that exits is
restarted with exponential backoff (1 s, doubling, at most 30 s). SIGINT/SIGTERM
stops them all (SIGTERM, then SIGKILL after 15 s) and then the server.

``--auth`` (or ``reel --auth DIR up``): the embedded server runs with the accounts of a
``reel auth init`` directory (``$REEL_AUTH_DIR``, default ``$REEL_HOME/auth``, written
if missing), the streams are created as its ``operator`` and each service connects
as its role (docs/security.md). Without it the embedded server has no auth and
listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

import typer
from rich.table import Table

from services.cli.auth import AUTH_DIR_ENV, auth_dir_from_env
from services.cli.common import CliError, Namespace, NatsUrl, console, err_console, reel_home, run_async
from services.cli.embed import SERVICES, service_serve
from shared.authdir import AuthDir, init
from shared.config import CONNECTION_FLAGS, Config
from shared.core.subjects import Names
from shared.nats.access import ConnectRefused
from shared.nats.embedded import embedded_server
from shared.nats.infra import connect, ensure_infra
from shared.roles import SERVICE_ROLE


def up(
    nats_url: str | None = NatsUrl,
    port: int = typer.Option(4222, help="port of the embedded nats-server"),
    store_dir: Path | None = typer.Option(None, help="JetStream store (default: $REEL_HOME/js)"),
    replicas: int = typer.Option(1, help="instances of each service"),
    namespace: str = Namespace,
    auth: bool = typer.Option(False, "--auth", help="users and permissions of `reel auth init` "
                              "($REEL_AUTH_DIR, default $REEL_HOME/auth; written if missing)"),
) -> None:
    """Start the embedded nats-server (unless --nats-url) and every service as supervised child processes."""
    async def body() -> int:
        auth_dir = auth_dir_from_env() if os.environ.get(AUTH_DIR_ENV) else None
        if auth and auth_dir is None:
            auth_dir = AuthDir(reel_home() / "auth")
            if not auth_dir.exists():
                init(auth_dir.path, Names(namespace))
                console.print(f"wrote NATS users and passwords to {auth_dir.path} (reel auth init)")
        async with contextlib.AsyncExitStack() as stack:
            url = nats_url
            if url is None:
                sd = store_dir or reel_home() / "js"
                sd.mkdir(parents=True, exist_ok=True)
                srv = await stack.enter_async_context(embedded_server(
                    port=port, store_dir=str(sd), config_file=str(auth_dir.server_conf) if auth_dir else None))
                url = srv.url
                console.print(f"nats-server {url} (JetStream store {sd}" + (f", users of {auth_dir.path})"
                                                                             if auth_dir else ")"))
            cfg = Config.from_env(nats_url=url, names=Names(namespace))
            if auth_dir is not None:
                cfg = auth_dir.config("operator", cfg)
            try:
                nc = await connect(cfg, name="reel-up")
            except ConnectRefused as exc:
                raise CliError(exc.message) from None
            await ensure_infra(nc, cfg)
            await nc.close()
            return await supervise(url, namespace, replicas, auth_dir)

    run_async(body())


def service_env(base: Mapping[str, str], name: str, auth: AuthDir | None) -> dict[str, str]:
    """The environment of service ``name``'s child: ``base`` with the credentials of its role
    (none of the ``REEL_NATS_*`` credentials of ``base`` pass to a child of ``auth``)."""
    if auth is None:
        return dict(base)
    env = {k: v for k, v in base.items()
           if k != AUTH_DIR_ENV and k not in {e for e, _ in CONNECTION_FLAGS.values()}}
    return {**env, **auth.env(SERVICE_ROLE[name])}


async def supervise(url: str, namespace: str, replicas: int, auth: AuthDir | None = None) -> int:
    """Run ``python -m services.<name>`` children (each as its role of ``auth``), restarting crashed
    ones with backoff, until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    env = {**os.environ, "NATS_URL": url, "REEL_NAMESPACE": namespace}
    names = [n for n in SERVICES if service_serve(n) is not None]
    table = Table(title="reel up", title_justify="left")
    table.add_column("service")
    table.add_column("instances")
    for n in names:
        table.add_row(n, str(replicas))
    console.print(table)
    console.print("[dim]Ctrl-C to stop[/]")

    async def keep(name: str, idx: int) -> None:
        failures = 0
        while not stop.is_set():
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", f"services.{name}",
                                                        env=service_env(env, name, auth))
            waiter = asyncio.create_task(proc.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                if proc.returncode is None:
                    proc.terminate()
                    try:
                        await asyncio.wait_for(proc.wait(), 15)
                    except TimeoutError:
                        proc.kill()
                return
            stopper.cancel()
            failures += 1
            delay = min(30.0, 0.5 * 2 ** min(failures, 6))
            err_console.print(f"[yellow]{name}#{idx} exited with {proc.returncode}; restarting in {delay:.1f}s[/]")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):  # unlike 3.11's wait_for, never swallows a cancel
                    await stop.wait()

    await asyncio.gather(*(keep(n, i) for n in names for i in range(replicas)))
    return 0
