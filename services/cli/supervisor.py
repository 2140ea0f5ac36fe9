"""``reel up``: the embedded nats-server (unless ``--nats-url``) and every service as supervised children.

Each service instance is ``python -P -m reel.services.<name>``; one that exits is
restarted with exponential backoff (:class:`Backoff`: 1 s, doubling, at most 30 s; back to 1 s once an
instance ran 60 s; after 8 crashes in a row, each within 60 s of its start, ``reel up`` says so, naming
the instance and its last exit, stops everything and exits 1). A ``--nats-url`` where nothing answers is
one error line naming the URL within seconds (``connect_cli``), not a silent wait.

Stopping (SIGINT/SIGTERM; each child runs in a session of its own, so a Ctrl-C at the terminal reaches only
``reel up``, and it gets SIGTERM should ``reel up`` die): the executors are sent SIGTERM first and let their
attempts in flight finish (``REEL_DRAIN_DEADLINE_S``, default 45 s, after which they interrupt them and record
them ``interrupted``) while the other services keep serving (a run that finished in the drain is verified);
once the executors are gone, the others are sent SIGTERM; then the server stops. A second Ctrl-C ends the
drain now (a second SIGTERM to each executor: its attempts recorded ``interrupted`` at once); a third kills
every child. A child that outlives its grace (an executor: its drain deadline + :data:`STOP_GRACE_S`; the others
:data:`STOP_GRACE_S`) is killed (SIGKILL).

The embedded server is supervised too: when it exits unasked, one line says how
(exit code or signal) and where its log is, and it is started again on the same
port and store (backoff 1 s doubling; at most :data:`SERVER_RESTARTS` in a row
without :data:`SERVER_HEALTHY_S` of running between); the services reconnect by
themselves. Past that budget ``reel up`` stops its services and exits 1.

``--auth`` (or ``reel --auth DIR up``): the embedded server runs with the accounts of a
``reel auth init`` directory (``$REEL_AUTH_DIR``, default ``$REEL_HOME/auth``, written
if missing), the streams are created as its ``operator`` and each service connects
as its role (docs/security.md). Without it the embedded server has no auth and
listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.table import Table

from reel.services.cli.auth import AUTH_DIR_ENV, auth_dir_from_env
from reel.services.cli.console import CliError, Namespace, NatsUrl, console, err_console, reel_home, run_async
from reel.services.cli.embed import SERVICES, connect_cli, service_serve
from reel.shared.auth.authdir import AuthDir, init
from reel.shared.auth.roles import SERVICE_ROLE, accounts
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.embedded import EmbeddedServer, StoreInUse, embedded_server
from reel.shared.nats.infra import ensure_infra
from reel.shared.runtime.config import CONNECTION_FLAGS, Config
from reel.shared.runtime.deathsig import die_with_parent


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
                try:
                    srv = await stack.enter_async_context(embedded_server(
                        port=port, store_dir=str(sd), config_file=str(auth_dir.server_conf) if auth_dir else None))
                except StoreInUse as exc:  # most often a `reel up` already running: commands find that one
                    raise CliError(f"{exc}: a `reel up` there already serves it (`reel status` lists its services; "
                                   "stop it first to start another), or pass --store-dir / set REEL_HOME for another "
                                   "store", kind="store_in_use") from None
                url = srv.url
                console.print(f"nats-server {url} (JetStream store {sd}" + (f", users of {auth_dir.path})"
                                                                             if auth_dir else ")"))
                warn_other_accounts(sd, Names(namespace), auth_dir is not None)
            cfg = Config.from_env(nats_url=url, names=Names(namespace))
            if auth_dir is not None:
                cfg = auth_dir.config("operator", cfg)
            nc = await connect_cli(cfg, "reel-up")  # a URL where nothing answers: one line within seconds
            await ensure_infra(nc, cfg)
            await nc.close()
            return await supervise(url, namespace, replicas, auth_dir, server=srv if nats_url is None else None)

    run_async(body())


def service_env(base: Mapping[str, str], name: str, auth: AuthDir | None) -> dict[str, str]:
    """The environment of service ``name``'s child: ``base`` with the credentials of its role
    (none of the ``REEL_NATS_*`` credentials of ``base`` pass to a child of ``auth``)."""
    if auth is None:
        return dict(base)
    env = {k: v for k, v in base.items()
           if k != AUTH_DIR_ENV and k not in {e for e, _ in CONNECTION_FLAGS.values()}}
    return {**env, **auth.env(SERVICE_ROLE[name])}


SERVER_RESTARTS = 5
"""Restarts of the embedded nats-server in a row before ``reel up`` gives up (exit 1)."""
SERVER_HEALTHY_S = 60.0
"""Seconds a restarted server must run for its restart budget to be full again (s)."""


def warn_other_accounts(store_dir: Path, names: Names, auth: bool) -> None:
    """Warn (stderr, one line) if ``store_dir`` holds streams of another NATS account than the one this ``reel up``
    uses: ``$G`` without ``--auth``, the Reel account (``REEL``) with it. JetStream keeps each account's streams
    apart (``<store>/jetstream/<account>/streams``), so those runs are not seen (docs/security.md)."""
    mine = accounts(names)[0] if auth else "$G"
    root = store_dir / "jetstream"
    others = sorted(d.name for d in root.iterdir() if d.name != mine and any((d / "streams").glob("*"))) \
        if root.is_dir() else []
    if others:
        err_console.print(f"[yellow]warning:[/] the store {store_dir} also holds streams of NATS account(s) "
                          f"{', '.join(others)}; this `reel up` ({'with' if auth else 'without'} --auth) uses account "
                          f"{mine}, so `reel ls` does not show their runs (docs/security.md)")


@dataclass(frozen=True)
class Backoff:
    """How a crashed child is restarted: after ``first_s``, doubling up to ``max_s`` per crash in a row; a child
    that ran ``stable_s`` before it exited starts the count again (its next restart waits ``first_s``);
    ``give_up_after`` crashes in a row, each sooner than ``stable_s`` after its start, and the supervisor gives up."""

    first_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0
    give_up_after: int = 8

    def delay_s(self, crashes: int) -> float:
        """Seconds before the restart after ``crashes`` (>= 1) crashes in a row."""
        return min(self.max_s, self.first_s * 2.0 ** (crashes - 1))


SERVICE_BACKOFF = Backoff()
"""The restart policy of ``reel up``'s services (1 s, 2 s, … 30 s; reset after 60 s up; 8 quick crashes: give up)."""


STOP_GRACE_S = 15.0
"""Seconds a child has after its last SIGTERM (an executor: after its drain deadline) before it is killed."""


@dataclass
class Stopping:
    """How far a stop has gone: ``now`` set by the second Ctrl-C (each child gets a second SIGTERM), ``kill`` by
    the third (each child SIGKILL)."""

    now: asyncio.Event
    kill: asyncio.Event

    @classmethod
    def new(cls) -> Stopping:
        return cls(asyncio.Event(), asyncio.Event())


async def keep_child(label: str, argv: list[str], env: Mapping[str, str], stop: asyncio.Event,
                     backoff: Backoff = SERVICE_BACKOFF, say: Callable[[str], object] | None = None, *,
                     grace_s: float = STOP_GRACE_S, stopping: Stopping | None = None) -> str | None:
    """Run ``argv`` in a session of its own (SIGTERM when this process dies) and restart it whenever it exits,
    until ``stop``: then SIGTERM it, again when ``stopping.now`` is set, SIGKILL when ``stopping.kill`` is or
    ``grace_s`` after the last SIGTERM.

    Each restart is one line through ``say`` (default: stderr): how the child exited, how long it ran, the delay.

    Returns:
        ``None`` once stopped, or why it gave up (``backoff.give_up_after`` quick crashes in a row, the
        last exit named) — the caller stops the rest.
    """
    say = say or err_console.print
    loop = asyncio.get_running_loop()
    crashes = 0
    while not stop.is_set():
        started = loop.time()
        proc = await asyncio.create_subprocess_exec(
            *argv, env=dict(env), start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, signal.SIGTERM, os.getpid()))
        waiter = asyncio.create_task(proc.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            await _stopped(proc, waiter, grace_s, stopping or Stopping.new())
            return None
        stopper.cancel()
        ran_s = loop.time() - started
        crashes = 1 if ran_s >= backoff.stable_s else crashes + 1
        how = f"{label} exited with {_how(proc.returncode)} after {ran_s:.1f}s"
        if crashes >= backoff.give_up_after:
            return (f"{how}; gave up: {crashes} crashes in a row, each within {backoff.stable_s:g}s of its start "
                    "(its log lines above say why)")
        delay = backoff.delay_s(crashes)
        say(f"[yellow]{how}; restarting in {delay:.1f}s ({crashes}/{backoff.give_up_after} in a row)[/]")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):  # unlike 3.11's wait_for, never swallows a cancel
                await stop.wait()
    return None


async def _stopped(proc: asyncio.subprocess.Process, exited: asyncio.Task[int], grace_s: float,
                   stopping: Stopping) -> None:
    """SIGTERM ``proc``, again once ``stopping.now`` is set; SIGKILL once ``stopping.kill`` is set or ``grace_s``
    after the last SIGTERM; return once it exited."""
    if proc.returncode is not None:
        return
    proc.terminate()
    now, kill = asyncio.ensure_future(stopping.now.wait()), asyncio.ensure_future(stopping.kill.wait())
    try:
        await asyncio.wait({exited, now, kill}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done() and now.done() and not kill.done():
            proc.terminate()  # the second SIGTERM: at once
            await asyncio.wait({exited, kill}, timeout=STOP_GRACE_S, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            proc.kill()
            await exited
    finally:
        now.cancel()
        kill.cancel()


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


async def watch_server(srv: EmbeddedServer, stop: asyncio.Event, give_up: asyncio.Event | None = None) -> int:
    """Restart ``srv`` when it exits unasked (one line each time) until ``stop``; 0, or 1 once the budget
    (:data:`SERVER_RESTARTS`) is spent or a restart fails (then ``give_up``, default ``stop``, is set)."""
    give_up = stop if give_up is None else give_up
    loop = asyncio.get_running_loop()
    restarts, started = 0, loop.time()
    while not stop.is_set():
        waiter = asyncio.create_task(srv.process.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not waiter.done():
            waiter.cancel()
            return 0
        restarts = 1 if loop.time() - started >= SERVER_HEALTHY_S else restarts + 1
        said = f"nats-server (pid {srv.process.pid}) exited with {_how(srv.process.returncode)}; log {srv.log_path}"
        if restarts > SERVER_RESTARTS:
            err_console.print(f"[red]{said}; {SERVER_RESTARTS} restarts in a row failed: stopping the services[/]")
            give_up.set()
            return 1
        delay = min(8.0, 0.5 * 2 ** restarts)
        err_console.print(f"[yellow]{said}; restarting it on port {srv.port} in {delay:.0f}s "
                          f"({restarts}/{SERVER_RESTARTS})[/]")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
                return 0
        try:
            await srv.restart()
        except RuntimeError as exc:
            err_console.print(f"[red]nats-server did not start again ({exc}); log {srv.log_path}: "
                              "stopping the services[/]")
            give_up.set()
            return 1
        started = loop.time()
    return 0


async def supervise(url: str, namespace: str, replicas: int, auth: AuthDir | None = None,
                    server: EmbeddedServer | None = None) -> int:
    """Run ``python -P -m reel.services.<name>`` children (each as its role of ``auth``), restarting crashed
    ones with backoff, until SIGINT/SIGTERM; restart ``server`` (the embedded one) as :func:`watch_server`.
    Returns the exit code: 0, or 1 if the server could not be kept running."""
    stop = asyncio.Event()  # the executors stop
    rest = asyncio.Event()  # the other services stop: once the executors are gone
    stopping = Stopping.new()
    env = {**os.environ, "NATS_URL": url, "REEL_NAMESPACE": namespace}
    drain_s = Config.from_env(nats_url=url).drain_deadline_s
    presses = 0

    def signalled() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            stop.set()
            console.print(f"stopping: the executors let the attempts in flight finish (up to {drain_s:g} s, then "
                          "they are recorded `interrupted`); Ctrl-C again interrupts them now", markup=False)
        elif presses == 2:
            stopping.now.set()
            console.print("interrupting the attempts in flight (recorded `interrupted`); Ctrl-C again kills the "
                          "services", markup=False)
        else:
            stopping.kill.set()
            console.print("killing the services (recovery resolves what they left open when they run again)",
                          markup=False)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signalled)
    names = [n for n in SERVICES if service_serve(n) is not None]
    table = Table(title="reel up", title_justify="left")
    table.add_column("service")
    table.add_column("instances")
    for n in names:
        table.add_row(n, str(replicas))
    console.print(table)
    console.print("[dim]Ctrl-C to stop[/]")

    gave_up: list[str] = []

    async def keep(name: str, idx: int) -> None:
        executor = name == "executor"
        reason = await keep_child(f"{name}#{idx}", [sys.executable, "-P", "-m", f"reel.services.{name}"],
                                  service_env(env, name, auth), stop if executor else rest,
                                  grace_s=drain_s + STOP_GRACE_S if executor else STOP_GRACE_S, stopping=stopping)
        if reason is not None:
            gave_up.append(reason)
            err_console.print(f"[red]{reason}: stopping the services[/]")
            stop.set()

    watcher = asyncio.create_task(watch_server(server, rest, give_up=stop)) if server is not None else None
    executors = [asyncio.create_task(keep(n, i)) for n in names if n == "executor" for i in range(replicas)]
    others = [asyncio.create_task(keep(n, i)) for n in names if n != "executor" for i in range(replicas)]
    await stop.wait()
    await asyncio.gather(*executors)
    rest.set()
    await asyncio.gather(*others)
    served = await watcher if watcher is not None else 0
    console.print("stopped", style="dim")
    return 1 if gave_up else served
