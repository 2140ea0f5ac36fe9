"""Real processes for the fault scenarios: Reel services as ``python -m services.<name>`` children and a
single nats-server that can be killed with SIGKILL and restarted on the same port and store.

Usage::

    async with ServiceProcs(cfg, tmp_path) as procs:
        crashing = await procs.start("executor", crash_at="s2:1:after_intent")
        await procs.start("verifier"); await procs.start("recovery")
        code = await procs.wait(crashing)           # 137: the injected crash
        await procs.start("executor")               # takes the run over

Every child gets the test's namespace and its short timings through the environment
(shared/runtime/config.py), logs JSON to its own file (quoted by :meth:`ServiceProcs.tail` when
a scenario fails) and is SIGKILLed when the block exits if it still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import nats

from reel.shared.nats.embedded import find_binary
from reel.shared.runtime.config import Config
from tests.conftest import REPO
from tests.support.cluster import free_ports

EXIT_KILLED = 137
"""What an injected crash exits with (``os._exit(137)``, as a SIGKILL reads in a shell)."""


@dataclass
class Proc:
    """One child: its name, process and log file."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def alive(self) -> bool:
        """Whether it still runs."""
        return self.process.returncode is None


@dataclass
class ServiceProcs:
    """Starts service children against ``cfg`` (namespace, lease TTL, ack wait) with logs under ``workdir``."""

    cfg: Config
    workdir: Path
    procs: list[Proc] = field(default_factory=list)

    def env(self, *, crash_at: str | None = None, nats_url: str | None = None) -> dict[str, str]:
        """The children's environment: ``cfg`` as ``REEL_*`` variables (and ``REEL_EXECUTOR_CRASH_AT``)."""
        c = self.cfg
        env = {**os.environ, "NATS_URL": nats_url or c.nats_url, "REEL_NAMESPACE": c.names.namespace,
               "REEL_LEASE_TTL_S": str(c.lease_ttl_s), "REEL_STORAGE": c.storage, "REEL_REPLICAS": str(c.replicas),
               "REEL_COMMAND_ACK_WAIT_S": str(c.command_ack_wait_s), "REEL_LOG_FORMAT": "json",
               "REEL_LOG_LEVEL": "INFO"}
        env.pop("REEL_EXECUTOR_CRASH_AT", None)
        env.pop("REEL_CANCEL_CRASH_AT", None)
        if crash_at:
            env["REEL_EXECUTOR_CRASH_AT"] = crash_at
        return env

    async def start(self, service: str, *, crash_at: str | None = None, env: dict[str, str] | None = None) -> Proc:
        """Start ``python -m services.<service>`` (``env``: more variables, e.g. ``REEL_CANCEL_CRASH_AT``); returns at
        once (its commands queue until it consumes)."""
        log_path = self.workdir / f"{service}-{len(self.procs)}.log"
        with log_path.open("wb") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", f"reel.services.{service}", cwd=REPO,
                env={**self.env(crash_at=crash_at), **(env or {})},
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
        proc = Proc(service, process, log_path)
        self.procs.append(proc)
        return proc

    async def wait(self, proc: Proc, timeout_s: float = 60.0) -> int:
        """Wait for ``proc`` to exit; its exit code (``-9`` for a SIGKILL, 137 for an injected crash).

        Raises:
            AssertionError: it still runs after ``timeout_s`` (its log's tail is in the message).
        """
        try:
            return await asyncio.wait_for(proc.process.wait(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"{proc.name} still runs after {timeout_s}s; log: {self.tail(proc)}") from None

    async def kill(self, proc: Proc) -> None:
        """kill -9 ``proc`` and reap it."""
        if proc.alive:
            proc.process.send_signal(signal.SIGKILL)
        await proc.process.wait()

    def tail(self, proc: Proc, chars: int = 3000) -> str:
        """The end of ``proc``'s log."""
        return proc.log_path.read_text(errors="replace")[-chars:] if proc.log_path.exists() else ""

    def logs(self) -> str:
        """The tails of every child's log (for a failing scenario's message)."""
        return "\n".join(f"--- {p.name} ({p.log_path.name}, exit {p.process.returncode})\n{self.tail(p, 1500)}"
                         for p in self.procs)

    async def __aenter__(self) -> ServiceProcs:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        for proc in self.procs:
            if proc.alive:
                proc.process.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.process.wait(), 10)
            except TimeoutError:
                await self.kill(proc)


@dataclass
class KillableServer:
    """One nats-server with JetStream on a fixed loopback port and store (``kill`` / ``restart`` keep both)."""

    store_dir: Path
    log_path: Path
    port: int = field(default_factory=lambda: free_ports(1)[0])
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>``."""
        return f"nats://127.0.0.1:{self.port}"

    async def start(self, timeout_s: float = 20.0) -> None:
        """Start it and return once JetStream answers (a rendezvous on ``$JS.API.INFO``).

        Raises:
            AssertionError: JetStream did not answer within ``timeout_s``.
        """
        with self.log_path.open("ab") as log_file:
            self.process = await asyncio.create_subprocess_exec(
                find_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store_dir),
                stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            with contextlib.suppress(Exception):
                nc = await nats.connect(self.url, connect_timeout=1, allow_reconnect=False)
                try:
                    await nc.request("$JS.API.INFO", b"", timeout=1)
                    return
                finally:
                    await nc.close()
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"nats-server on {self.url} not ready in {timeout_s}s: "
                                     f"{self.log_path.read_text(errors='replace')[-2000:]}")
            await asyncio.sleep(0.1)

    def freeze(self) -> None:
        """SIGSTOP the server: it reads nothing more and answers nothing (a hung host), so what clients send
        now is in flight, unanswered, when it is then killed (:meth:`kill` works on a frozen server)."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGSTOP)

    async def kill(self) -> None:
        """kill -9 the server and reap it."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()

    async def stop(self) -> None:
        """SIGTERM (then SIGKILL after 10 s)."""
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                await self.kill()


@contextlib.asynccontextmanager
async def killable_server(workdir: Path) -> AsyncIterator[KillableServer]:
    """A :class:`KillableServer` under ``workdir`` for the block (stopped at the end)."""
    (workdir / "js").mkdir(parents=True, exist_ok=True)
    srv = KillableServer(store_dir=workdir / "js", log_path=workdir / "nats-server.log")
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()
