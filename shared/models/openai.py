"""The ``openai`` adapter: any OpenAI-compatible chat-completions endpoint, on the official ``openai`` package.

vLLM, llama.cpp's server, Ollama, LiteLLM and most hosted providers serve this wire
format. Each attempt is one HTTP call (the client's own retries are off, so every try
is an attempt in the log) on a client opened and closed for it. The body sent is
exactly :func:`reel.shared.core.chat.messages.wire_request` of the request — what the executor
stored as the prompt blob of an agent turn or a ``kind: model`` step — and
the response message is returned exactly as sent.

The API key is read from the environment variable ``api_key_env`` names, at each call,
in the executor's process; it is never put in an error message, a log line or
anything returned (any echo of it in a provider's message is replaced by ``***``).

Errors (``ModelError.kind``; retryable ones marked *):
``rate_limited``* (429; ``Retry-After``/``retry-after-ms`` → ``retry_after_s``),
``quota_exceeded`` (429 ``insufficient_quota``), ``server_error``* (5xx),
``timeout``* (``timeout_s`` passed, or 408), ``connection``*, ``conflict``* (409),
``bad_request`` (400, 422), ``auth`` (401, 403, or the key's variable unset),
``not_found`` (404), ``context_length`` (context exceeded, or 413),
``empty_response``*, ``malformed_response``*, ``stream_broken``* (a streamed response ended
or broke before its ``finish_reason``).

**Streaming** (the spec's ``stream: true``): the request body carries ``stream: true`` and
``stream_options: {include_usage: true}`` (it is still exactly the prompt blob); the chunks
are assembled as they arrive (:class:`reel.shared.core.chat.chunks.StreamAssembler`, tool-call
fragments included), each fragment handed to ``on_delta``, and the response returned is
the assembled one — its ``message`` the output blob, as without streaming.
Source: OpenAI API reference, "Error codes", "Streaming"; the ``openai`` package's exception classes.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import os
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import msgspec
import openai
from openai._models import FinalRequestOptions

from reel.shared.auth import secrets
from reel.shared.core.chat.chunks import StreamAssembler, broken
from reel.shared.core.chat.messages import (
    ChatRequest,
    ChatResponse,
    response_from_wire,
    wire_request,
)
from reel.shared.core.errors import ModelError
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER, TokenCounter
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.models.base import DeltaSink

if TYPE_CHECKING:  # the SDK's HTTP client (its dependency, not Reel's): its requests are only copied here
    import httpx2

PLACEHOLDER_KEY = "reel-no-key"  # sent when no api_key_env is given (local servers ignore it)
_CONTEXT = re.compile(r"context[ _](length|size|window)|maximum context|too many tokens|prompt is too long", re.I)
_CONTEXT_CODES = {"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"}


def retry_after_s(headers: Mapping[str, str], now_s: float | None = None) -> float | None:
    """The delay a response asks for (s): ``retry-after-ms``, else ``Retry-After`` (seconds or HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def _detail_text(detail: Any) -> str:
    """A ``detail`` field as one text: a string as-is; a list of validation errors (FastAPI/pydantic:
    ``{loc, msg}``) as ``loc: msg; …``; anything else as its JSON."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and all(isinstance(d, dict) and "msg" in d for d in detail):
        return "; ".join(".".join(str(p) for p in d.get("loc") or ()) + f": {d['msg']}" for d in detail)
    return msgspec.json.encode(detail).decode()


def server_message(body: Any) -> tuple[str, str]:
    """(message, code) a server's error body states, in its own words: ``error.message`` (OpenAI, vLLM,
    llama.cpp, LiteLLM), ``detail`` (FastAPI servers: llama-cpp-python …), ``message``, a string ``error``
    (Ollama); ``error.code``/``error.type`` as the code. ``("", "")`` when it states none."""
    if not isinstance(body, dict):
        return "", ""
    inner = body.get("error")
    if isinstance(inner, dict):
        message, code = server_message(inner)
        return message, code or str(body.get("code") or body.get("type") or "")
    for field in ("message", "detail", "error"):
        value = body.get(field)
        if value:
            return _detail_text(value), str(body.get("code") or body.get("type") or "")
    return "", str(body.get("code") or body.get("type") or "")


def _error_body(exc: openai.APIStatusError) -> tuple[bytes, str]:
    """The error response's body exactly as received (b"" if it was never read) and its media type."""
    try:
        content = exc.response.content
    except Exception:  # httpx.ResponseNotRead: a stream whose error body was not read
        content = b""
    return content, exc.response.headers.get("content-type", "application/json").split(";")[0].strip()


def _provider_message(exc: openai.APIStatusError, raw: bytes) -> tuple[str, str]:
    """(message, code) of an error response: the server's own message (:func:`server_message`) from the raw
    body (else the SDK's parse of it), or — a body that states none — the body text."""
    try:
        decoded: Any = msgspec.json.decode(raw) if raw else exc.body
    except msgspec.DecodeError:
        decoded = exc.body
    message, code = server_message(decoded)
    if message:
        return message, code
    if isinstance(decoded, dict):
        return msgspec.json.encode(decoded).decode(), code
    text = raw.decode(errors="replace") if raw else (exc.body if isinstance(exc.body, str) else "")
    return text.strip(), code


def _kind(status: int, code: str, message: str) -> tuple[str, bool]:
    if status == 429:
        return ("quota_exceeded", False) if code == "insufficient_quota" else ("rate_limited", True)
    if status == 413 or code in _CONTEXT_CODES or (status == 400 and _CONTEXT.search(message)):
        return "context_length", False
    if status >= 500:
        return "server_error", True
    fixed = {400: ("bad_request", False), 422: ("bad_request", False), 401: ("auth", False), 403: ("auth", False),
             404: ("not_found", False), 408: ("timeout", True), 409: ("conflict", True)}
    return fixed.get(status, ("http_error", False))


class _Client(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` that builds the request of a plain POST of bytes (the streamed chat call) once per
    URL and reuses it for every call with that call's body.

    The SDK builds each request anew — its headers merged from the client's defaults and the key's auth
    headers, its URL parsed and joined to the base URL twice (≈ 10 % of an executor's CPU per streamed turn of
    bench/live_agents.py, py-spy) — though for such a call nothing of it but the body differs: the client's
    key, base URL and timeout are fixed (:class:`ClientPool` keys clients by them) and its retries are off.
    The first such call's request is the SDK's own (``_build_request``); later ones copy its method, URL,
    headers (all but ``Content-Length`` and ``Host``, set for the new body) and extensions. A call with any
    option of its own (headers, query, timeout, files, JSON, a retry, other auth) is built by the SDK. The rest
    of the call — options, auth, sending, errors, the response and its stream — is the SDK's as before.
    """

    _templates: dict[tuple[str, str], tuple[httpx2.Request, list[tuple[bytes, bytes]]]]

    async def post_stream(self, path: str, content: bytes, stream_cls: type[_StreamT]) -> _StreamT:
        """``post(path, content=content, cast_to=object, stream=True, stream_cls=stream_cls)``, the request options
        a copy of one built once (the SDK's ``post`` constructs them anew, deep-copying their defaults)."""
        options = _POST_OPTIONS.model_copy(update={"url": path, "content": content, "params": {},
                                                   "security": dict(_DEFAULT_SECURITY)})
        return await self.request(object, options, stream=True, stream_cls=stream_cls)

    @property
    def user_agent(self) -> str:
        """The SDK's own (it names the client's class: ``AsyncOpenAI/Python <version>``)."""
        return super().user_agent.replace(type(self).__name__, openai.AsyncOpenAI.__name__, 1)

    def _build_request(self, options: FinalRequestOptions, *, retries_taken: int = 0) -> httpx2.Request:
        if not _plain_post(options, retries_taken) or self._idempotency_header:
            return super()._build_request(options, retries_taken=retries_taken)
        templates = self.__dict__.setdefault("_templates", {})
        key = (options.method, options.url)
        found = templates.get(key)
        if found is None:
            first = super()._build_request(options, retries_taken=retries_taken)
            kept = [(k, v) for k, v in first.headers.raw if k.lower() not in (b"content-length", b"host")]
            templates[key] = (first, kept)
            return first
        template, headers = found
        assert isinstance(options.content, bytes)  # _plain_post
        request: httpx2.Request = type(template)(template.method, template.url, headers=headers,
                                                 content=options.content, extensions=template.extensions)
        return request


_POST_OPTIONS = FinalRequestOptions.construct(method="post", url="/", content=b"")
_DEFAULT_SECURITY = _POST_OPTIONS.security
_StreamT = TypeVar("_StreamT", bound=openai.AsyncStream[Any])


def _plain_post(options: FinalRequestOptions, retries_taken: int) -> bool:
    """Whether ``options`` is a first try of a POST of bytes with no option of its own (see :class:`_Client`)."""
    return (retries_taken == 0 and options.method == "post" and isinstance(options.content, bytes)
            and not options.headers and not options.params and isinstance(options.timeout, openai.NotGiven)
            and options.files is None and options.json_data is None and options.extra_json is None
            and options.follow_redirects is None and options.security == _DEFAULT_SECURITY)


class ClientPool:
    """The ``openai.AsyncOpenAI`` clients of this process, one per event loop, endpoint, API key and timeout,
    reused across calls: a client holds an HTTP connection pool and a TLS context, and building one per call
    cost most of an agent turn's CPU. At most ``max_clients`` per loop (least recently used closed first);
    a loop's clients go with it. Keys are held as their sha256, never logged.

    Each client sends over the SDK's ``aiohttp`` transport (``openai.DefaultAioHttpClient``, the SDK's own
    option for many concurrent calls; the SDK's defaults otherwise): httpcore's pool walks every pooled
    connection, probing each idle one's socket, for every request and every response closed, and parses
    HTTP in Python — with hundreds of runs waiting on one endpoint, ≈ 60 % less client CPU per streamed call
    over aiohttp's pool and C parser (256 calls at once against bench/_live_server.py).
    """

    def __init__(self, max_clients: int = 32) -> None:
        self.max_clients = max_clients
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                 OrderedDict[tuple[str, str, float | None], _Client]]
        self._by_loop = weakref.WeakKeyDictionary()

    def get(self, base_url: str, key: str, timeout_s: float | None) -> _Client:
        """The loop's client for ``base_url`` with ``key`` (``timeout_s`` per request; ``None``: the SDK's)."""
        clients = self._by_loop.setdefault(asyncio.get_running_loop(), OrderedDict())
        ident = (base_url, hashlib.sha256(key.encode()).hexdigest(), timeout_s)
        client = clients.get(ident)
        if client is None or client.is_closed():
            client = _Client(api_key=key, base_url=base_url, timeout=timeout_s, max_retries=0,
                             http_client=openai.DefaultAioHttpClient())
            clients[ident] = client
            while len(clients) > self.max_clients:
                _, old = clients.popitem(last=False)
                asyncio.get_running_loop().create_task(old.close())
        clients.move_to_end(ident)
        return client

    def size(self) -> int:
        """How many clients the running loop holds."""
        return len(self._by_loop.get(asyncio.get_running_loop(), ()))

    async def aclose(self) -> None:
        """Close the running loop's clients (their connections); the next call builds new ones."""
        clients = self._by_loop.pop(asyncio.get_running_loop(), OrderedDict())
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)


CLIENTS = ClientPool()
"""The process's pool (:class:`ClientPool`): every :class:`OpenAIAdapter` call goes through it."""


class ChunkDicts(openai.AsyncStream[dict[str, Any]]):
    """A streamed chat completion's chunks as the JSON objects the server sent (msgspec-decoded), not SDK models.

    The SDK's own stream builds a pydantic ``ChatCompletionChunk`` per event, which :class:`StreamAssembler` turns
    back into the dict it was (with the request's own transform, ≈ 20 % of an executor's CPU per streamed turn
    of bench/live_agents.py, py-spy); the body is sent as is, exactly the prompt blob. Server-sent events are read
    and their transport errors mapped by the SDK (``_iter_events``: ``APITimeoutError``, ``APIConnectionError``); an
    event whose object carries ``error`` raises ``APIError`` with it, and so does one that is not JSON; ``[DONE]``
    ends the stream (read to its end, so the connection is reused), as in the SDK.
    """

    async def __stream__(self) -> Any:  # an async generator of dict chunks (the base class types it as _T)
        events = self._iter_events()
        try:
            async for sse in events:
                if sse.data.startswith("[DONE]"):
                    async for _ in events:  # read to the end: the connection is kept alive for the next call
                        pass
                    break
                try:
                    data = msgspec.json.decode(sse.data)
                except msgspec.DecodeError as exc:
                    raise openai.APIError(message=f"a streamed chunk is not JSON: {sse.data[:200]!r}",
                                          request=self.response.request, body=None) from exc
                if isinstance(data, dict) and data.get("error"):
                    error = data["error"]
                    message = error.get("message") if isinstance(error, dict) else None
                    raise openai.APIError(message=message if isinstance(message, str) and message else
                                          "An error occurred during streaming", request=self.response.request,
                                          body=error)
                yield data
        finally:
            await self.response.aclose()


class OpenAIAdapter:
    """A chat-completions endpoint (``base_url``, ``model``, ``api_key_env``, ``params``, ``timeout_s``, ``price``)."""

    name = "openai"

    def __init__(self, spec: ModelSpec, counter: TokenCounter = DEFAULT_COUNTER) -> None:
        for field in ("base_url", "model"):
            if not isinstance(getattr(spec, field), str):
                raise ValueError(f"openai adapter needs `{field}`")
        assert isinstance(spec.base_url, str)
        self._spec, self._counter, self._base_url = spec, counter, spec.base_url

    def __repr__(self) -> str:
        return f"OpenAIAdapter(base_url={self._base_url!r}, model={self._spec.model_name!r})"

    def _api_key(self) -> str:
        env = self._spec.api_key_env
        if not isinstance(env, str):
            return PLACEHOLDER_KEY
        key = os.environ.get(env)
        if not key:
            raise ModelError(f"the API key variable {env} is not set in the executor's environment", kind="auth",
                             retryable=False)
        secrets.remember([(env, key)])  # from now on scrubbed from whatever this process records
        return key

    async def complete_chat(self, request: ChatRequest, on_delta: DeltaSink | None = None) -> ChatResponse:
        """One HTTP call sending exactly ``wire_request(request)`` (streamed when ``request.stream``: each
        fragment to ``on_delta`` as it arrives).

        Raises:
            ModelError: mapped as in the module docstring; never carries the API key.
        """
        key = self._api_key()
        body = wire_request(request)
        decoded: Any
        if request.stream:
            decoded, err = await self._stream(body, key, on_delta)
            data = b""
        else:
            (data, err), decoded = await self._post(body, key), None
        if err is not None:  # raised outside the handler: no __context__ holding the SDK's request
            raise err
        if not request.stream:
            try:
                decoded = msgspec.json.decode(data)
            except msgspec.DecodeError:
                decoded = None
        if not isinstance(decoded, dict):
            raise ModelError(f"malformed chat-completions response: not a JSON object: {_scrub(data[:200], key)}",
                             kind="malformed_response", retryable=True, body=_scrub_bytes(data, key) or None,
                             body_media_type="text/plain")
        taken = {c.id for m in request.messages for c in m.tool_calls}
        resp = response_from_wire(decoded, turn=request.turn, spec=self._spec, taken=taken)
        if resp.usage_source == "none":  # a server that reports none: count (labelled), so budgets still see it
            tokens_in = self._counter.count(msgspec.json.encode(body["messages"]).decode())
            tokens_out = self._counter.count(" ".join([resp.text, *(c.arguments for c in resp.tool_calls)]))
            resp = msgspec.structs.replace(resp, input_tokens=tokens_in, output_tokens=tokens_out,
                                           cost_usd=self._spec.cost_usd(tokens_in, tokens_out),
                                           usage_source="estimated")
        return resp

    async def _post(self, body: dict[str, Any], key: str) -> tuple[bytes, ModelError | None]:
        try:
            client = self._client(key)
            raw = await client.chat.completions.with_raw_response.create(
                model=body["model"], messages=body["messages"],
                extra_body={k: v for k, v in body.items() if k not in ("model", "messages")})
            return raw.http_response.content, None
        except (openai.APIStatusError, openai.APIConnectionError) as exc:  # a timeout is a connection error
            return b"", self._error(exc, key)

    def _client(self, key: str) -> _Client:
        return CLIENTS.get(self._base_url, key, self._spec.timeout)

    async def _stream(self, body: dict[str, Any], key: str, on_delta: DeltaSink | None
                      ) -> tuple[dict[str, Any] | None, ModelError | None]:
        """The streamed call: the assembled response body, or the error (a break mid-way: ``stream_broken``)."""
        acc = StreamAssembler()
        try:
            client = self._client(key)
            # the body's bytes as the executor stored them (msgspec), not re-encoded by the SDK's JSON encoder
            stream = await client.post_stream("/chat/completions", msgspec.json.encode(body), ChunkDicts)
            async with stream:  # closed however it ends: its connection goes back to the pool
                async for chunk in stream:
                    fragment = acc.add(chunk)
                    if fragment is not None and on_delta is not None:
                        await on_delta(fragment)
        except ModelError as exc:
            return None, exc
        except openai.APIStatusError as exc:
            return None, self._error(exc, key)
        except openai.APIError as exc:  # the connection broke, timed out, or the server sent an error mid-way
            if not acc.chunks:
                return None, self._error(exc, key)
            cause = _scrub(f"{type(exc).__name__}: {exc.__cause__ or exc.message}", key)
            return None, broken(acc.chunks, cause)
        try:
            return acc.body(), None
        except ModelError as exc:
            return None, exc

    def _error(self, exc: openai.APIError, key: str) -> ModelError:
        """A failed call's error (the kinds of the module docstring); never carries the key."""
        if isinstance(exc, openai.APIStatusError):
            raw, media = _error_body(exc)
            message, code = _provider_message(exc, raw)
            kind, retryable = _kind(exc.status_code, code, message)
            after = retry_after_s(exc.response.headers) if retryable else None
            said = " ".join(message.split())  # one line: the whole body is kept beside it
            text = f"{self._base_url} answered {exc.status_code}{f' ({code})' if code else ''}: {said}"
            return ModelError(_scrub(text, key), kind=kind, retryable=retryable, retry_after_s=after,
                              body=_scrub_bytes(raw, key) or None, body_media_type=media)
        if isinstance(exc, openai.APITimeoutError) and not _refused(exc):
            return ModelError(f"{self._base_url} did not answer within {self._spec.timeout:g} s", kind="timeout")
        if isinstance(exc, openai.APIConnectionError):  # a timeout that is a refused connect included
            cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
            return ModelError(_scrub(f"cannot reach {self._base_url}{cause}", key), kind="connection")
        return ModelError(_scrub(f"{self._base_url}: {exc.message}", key), kind="malformed_response")


def _refused(exc: BaseException) -> bool:
    """Whether a timeout is a connection that failed without any wait: the ``aiohttp`` transport reports every
    ``ClientConnectionError`` as a connect *timeout* — a connect refused, unreachable or to no such host
    (``ClientConnectorError``), and a server that closed the connection without an answer
    (``ServerDisconnectedError``); only aiohttp's own timeouts (``asyncio.TimeoutError``) are waits."""
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, asyncio.TimeoutError):
            return True
        cause = cause.__cause__
    return False


def _scrub(text: str | bytes, key: str) -> str:
    """``text`` with every occurrence of the API key replaced by ``***`` (never cut: the executor bounds the
    one-line message it records, keeping its head and tail, and stores the whole body beside it)."""
    s = text.decode(errors="replace") if isinstance(text, bytes) else text
    if key and key != PLACEHOLDER_KEY:
        s = s.replace(key, "***")
    return s


def _scrub_bytes(data: bytes, key: str) -> bytes:
    """``data`` with every occurrence of the API key replaced by ``***``, bytes otherwise untouched."""
    return data.replace(key.encode(), b"***") if key and key != PLACEHOLDER_KEY else data
