"""A real chat-completions server on a free loopback port, scripted per test (no HTTP mocks).

The ``chat_server`` fixture starts one :class:`ChatServer` (an aiohttp app serving
``POST /v1/chat/completions``) per test. A test queues behaviours — one per request, in
order — and reads back every request body it saw::

    chat_server.script(reply(tool_calls=[call("read_file", {"path": "a.py"})]), rate_limited(2), reply("done"))
    ...  # point an openai adapter at chat_server.url
    assert chat_server.requests[0].body["tools"][0]["function"]["name"] == "read_file"

A request with nothing left in the queue gets a 500 and is counted in ``unscripted`` — unless the server was
made with a ``respond`` function, which then answers each such request from its body (a model whose answer
depends on the prompt: examples/crucible-agent/model.py).
A :func:`slow` behaviour holds its request until the server stops (a client timeout
fires first), so timeout tests need no sleeps. A :func:`hang` behaviour never answers and
reports, through its :class:`Hang`, when the request arrived and when the client closed the
connection (the server's handler is cancelled on a client disconnect): the rendezvous of the
cancel tests. A :func:`streamed` behaviour answers as a ``stream: true`` request asks: server-sent
events, one ``chat.completion.chunk`` per delta (text and tool-call arguments split across
chunks), the usage chunk and ``[DONE]`` — or the connection cut after ``cut_at`` chunks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

COMPLETIONS = "/v1/chat/completions"


class Hang:
    """The test's side of a :func:`hang` request: ``arrived`` once the server holds it, ``closed`` once the
    client dropped the connection (monotonic time in ``closed_at``)."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.closed = asyncio.Event()
        self.closed_at = 0.0


class Pause:
    """A :func:`streamed` response's stop mid-way: ``reached`` once the server has sent the chunks before it,
    the rest sent once the test sets ``resume``."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.resume = asyncio.Event()


@dataclass(frozen=True)
class Behaviour:
    """What the server does with one request.

    ``body`` is JSON-encoded unless it is ``bytes`` (sent raw); any ``{authorization}`` in
    a string body is replaced by the request's Authorization header (to test key scrubbing).
    ``hold`` keeps the request open until the server stops; ``hang`` keeps it open until the
    client goes away, and reports both.
    """

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    hold: bool = False
    hang: Hang | None = None
    chunks: tuple[dict[str, Any], ...] = ()
    cut_at: int | None = None
    gate: asyncio.Event | None = None
    pause_at: int = 0
    pause: Pause | None = None


@dataclass(frozen=True)
class Seen:
    """One request the server received: its JSON body, headers and the client's ``(host, port)`` (one per TCP
    connection: requests that share it came over one kept-alive connection)."""

    body: dict[str, Any]
    headers: Mapping[str, str]
    peer: tuple[str, int] | None = None


def call(name: str, arguments: Mapping[str, Any] | str, id: str = "") -> dict[str, Any]:
    """A tool call in the wire format (``arguments`` JSON-encoded unless given as text)."""
    args = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}


def reply(text: str | None = None, tool_calls: Iterable[dict[str, Any]] = (), *, usage: tuple[int, int] | None = (
        12, 7), model: str = "loopback-1", finish_reason: str | None = None) -> Behaviour:
    """A 200 completion: ``text`` and/or ``tool_calls``; ``usage`` (prompt, completion) or None for none."""
    calls = list(tool_calls)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": "chatcmpl-loopback", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish_reason or ("tool_calls" if calls else "stop")}],
    }
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return Behaviour(body=body)


def error(status: int, message: str, *, code: str | None = None, type: str = "invalid_request_error",
          headers: Mapping[str, str] | None = None) -> Behaviour:
    """An error response in OpenAI's shape: ``{"error": {"message", "type", "code"}}``."""
    return Behaviour(status=status, body={"error": {"message": message, "type": type, "code": code}},
                     headers=dict(headers or {}))


def rate_limited(retry_after: str | float = 2) -> Behaviour:
    """A 429 with ``Retry-After`` (seconds or an HTTP date)."""
    return error(429, "Rate limit reached, slow down", code="rate_limit_exceeded", type="requests",
                 headers={"Retry-After": str(retry_after)})


def server_error(status: int = 500) -> Behaviour:
    """A 5xx."""
    return error(status, "The server had an error while processing your request", type="server_error")


def slow() -> Behaviour:
    """Never answers while the client waits (held until the server stops)."""
    return Behaviour(hold=True)


def hang(signal: Hang) -> Behaviour:
    """Never answers; ``signal`` says when the request arrived and when the client closed the connection."""
    return Behaviour(hang=signal)


def _split(text: str, parts: int) -> list[str]:
    """``text`` in ``parts`` non-empty pieces (as even as possible)."""
    assert len(text) >= parts > 0, (text, parts)
    step, extra = divmod(len(text), parts)
    out, at = [], 0
    for i in range(parts):
        n = step + (i < extra)
        out.append(text[at:at + n])
        at += n
    return out


def stream_deltas(text: str, tool_calls: Iterable[dict[str, Any]], chunks: int) -> list[dict[str, Any]]:
    """The ``delta`` (and ``finish_reason``) of each of ``chunks`` chunks: the role, ``text`` in pieces, each
    call's header (id, name) then its arguments in pieces, the finish. The pieces are shared out evenly."""
    calls = list(tool_calls)
    pieces = chunks - 2 - len(calls)
    sizes = [len(text)] + [len(c["function"]["arguments"]) for c in calls]
    parts = [max(1, pieces * n // sum(sizes)) if n else 0 for n in sizes]
    parts[0] += pieces - sum(parts)
    out: list[dict[str, Any]] = [{"delta": {"role": "assistant", "content": ""}}]
    out += [{"delta": {"content": piece}} for piece in (_split(text, parts[0]) if text else [])]
    for i, (c, k) in enumerate(zip(calls, parts[1:], strict=True)):
        out.append({"delta": {"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                              "function": {"name": c["function"]["name"], "arguments": ""}}]}})
        out += [{"delta": {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}}
                for piece in _split(c["function"]["arguments"], k)]
    out.append({"delta": {}, "finish_reason": "tool_calls" if calls else "stop"})
    assert len(out) == chunks, (len(out), chunks)
    return out


def streamed(text: str = "", tool_calls: Iterable[dict[str, Any]] = (), *, chunks: int = 20,
             cut_at: int | None = None, usage: tuple[int, int] = (12, 7), model: str = "loopback-1",
             gate: asyncio.Event | None = None, pause_at: int = 0, pause: Pause | None = None) -> Behaviour:
    """A streamed 200 (``text/event-stream``): ``chunks`` chunks (:func:`stream_deltas`), then a usage chunk
    and ``[DONE]``; with ``cut_at``, the connection is cut after that many chunks; with ``gate``, the first
    chunk waits until it is set; with ``pause``, the stream stops after ``pause_at`` chunks until it resumes."""
    frames = [{"id": "chatcmpl-loopback", "object": "chat.completion.chunk", "created": 0, "model": model,
               "choices": [{"index": 0, "delta": d["delta"], "finish_reason": d.get("finish_reason")}]}
              for d in stream_deltas(text, tool_calls, chunks)]
    frames.append({"id": "chatcmpl-loopback", "object": "chat.completion.chunk", "created": 0, "model": model,
                   "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                            "total_tokens": sum(usage)}})
    return Behaviour(chunks=tuple(frames), cut_at=cut_at, gate=gate, pause_at=pause_at, pause=pause)


def empty(no_choices: bool = False) -> Behaviour:
    """A 200 with no content and no tool calls (or with no choices at all)."""
    b = reply(None)
    if no_choices:
        return Behaviour(body={**b.body, "choices": []})
    return b


class ChatServer:
    """The loopback server: ``url`` is its ``base_url`` (``http://127.0.0.1:<port>/v1``)."""

    def __init__(self, respond: Callable[[dict[str, Any]], Behaviour] | None = None) -> None:
        self.respond = respond
        self.queue: deque[Behaviour] = deque()
        self.requests: list[Seen] = []
        self.unscripted = 0
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours for the next requests, in order."""
        self.queue.extend(behaviours)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        seen = Seen(body=await request.json(), headers=dict(request.headers),
                    peer=(str(peer[0]), int(peer[1])) if peer else None)
        self.requests.append(seen)
        if self.queue:
            b = self.queue.popleft()
        elif self.respond is not None:
            b = self.respond(seen.body)
        else:
            self.unscripted += 1
            return web.json_response({"error": {"message": "chat_server: no scripted behaviour left"}}, status=500)
        if b.hang is not None:
            return await self._hang(b.hang)
        if b.chunks:
            return await self._stream(request, b)
        if b.hold:
            await self._release.wait()
            return web.json_response({"error": {"message": "released at shutdown"}}, status=503)
        body = b.body
        if isinstance(body, str):
            body = body.replace("{authorization}", request.headers.get("Authorization", ""))
        elif isinstance(body, dict) and isinstance(body.get("error"), dict):
            err = dict(body["error"])
            err["message"] = str(err.get("message", "")).replace(
                "{authorization}", request.headers.get("Authorization", ""))
            body = {**body, "error": err}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return web.Response(status=b.status, body=data, headers=dict(b.headers), content_type="application/json")

    async def _hang(self, signal: Hang) -> web.StreamResponse:
        signal.arrived.set()
        try:
            await asyncio.Event().wait()  # until the client disconnects: aiohttp cancels this handler
        except asyncio.CancelledError:
            signal.closed_at = time.monotonic()
            signal.closed.set()
            raise
        raise AssertionError("unreachable")

    async def _stream(self, request: web.Request, b: Behaviour) -> web.StreamResponse:
        if b.gate is not None:
            await b.gate.wait()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for i, frame in enumerate(b.chunks):
            if b.pause is not None and i == b.pause_at:
                b.pause.reached.set()
                await b.pause.resume.wait()
            if b.cut_at is not None and i == b.cut_at:
                assert request.transport is not None
                request.transport.close()  # mid-way, no terminating chunk: the client sees the stream break
                return resp
            await resp.write(b"data: " + json.dumps(frame).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(COMPLETIONS, self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def chat_server() -> AsyncIterator[ChatServer]:
    """A started :class:`ChatServer`, stopped after the test."""
    server = ChatServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
