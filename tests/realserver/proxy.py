"""A loopback TCP proxy in front of the real server that keeps the exact bytes of every HTTP request body.

It forwards each connection to the upstream server untouched (both directions, byte for byte) and, on the
way up, parses the HTTP/1.1 requests (``Content-Length`` bodies, as the ``openai`` client sends them) to
record ``(method, path, body)`` — so a test compares what reached the server with the prompt blob the
executor stored. Each request goes up with ``Connection: close`` (the one header changed), so the server
closes the connection after its answer and a connection carries one request and its response, kept whole
(``Conn.response``: status line, headers, body or server-sent events); the client's connection pool opens a
new connection for its next request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

HEAD_END = b"\r\n\r\n"


@dataclass
class Seen:
    method: str
    path: str
    body: bytes


@dataclass
class Conn:
    """One client connection: the requests on it, in order, and every byte the server sent back."""

    requests: list[Seen] = field(default_factory=list)
    response: bytearray = field(default_factory=bytearray)


@dataclass
class RecordingProxy:
    """``url``: the proxy's base (``http://127.0.0.1:PORT/v1``); ``conns``: every connection, in order."""

    upstream_host: str
    upstream_port: int
    url: str = ""
    conns: list[Conn] = field(default_factory=list)

    def chat(self) -> list[tuple[bytes, bytes]]:
        """(request body, the connection's response bytes) of each chat-completions request, in order."""
        return [(r.body, bytes(c.response)) for c in self.conns for r in c.requests
                if r.path.endswith("/chat/completions")]

    def chat_bodies(self) -> list[bytes]:
        """The bodies of the chat-completions requests, in order."""
        return [body for body, _ in self.chat()]

    async def _handle(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        conn = Conn()
        self.conns.append(conn)
        try:
            up_r, up_w = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:  # the server is gone: the client sees its connection closed
            down_w.close()
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._up(down_r, up_w, conn))
            tg.create_task(_pipe(up_r, down_w, conn.response))

    async def _up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Conn) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(HEAD_END)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length) if length else b""
                method, path, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
                conn.requests.append(Seen(method=method, path=path, body=body))
                kept = [ln for ln in head[:-len(HEAD_END)].split(b"\r\n")
                        if ln.partition(b":")[0].strip().lower() != b"connection"]
                head = b"\r\n".join([*kept, b"Connection: close"]) + HEAD_END
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: bytearray) -> None:
    try:
        while data := await reader.read(65536):
            seen += data
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.asynccontextmanager
async def recording_proxy(upstream_host: str, upstream_port: int) -> AsyncIterator[RecordingProxy]:
    """A :class:`RecordingProxy` listening on a free loopback port for the time of the block."""
    proxy = RecordingProxy(upstream_host, upstream_port)
    server = await asyncio.start_server(proxy._handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield proxy
    finally:
        server.close()
        await server.wait_closed()
