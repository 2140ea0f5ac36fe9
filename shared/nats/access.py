"""A NATS connection with credentials and TLS, whose permission violations are errors, not hangs.

:func:`open_connection` connects a :class:`ReelConnection` (a ``nats.aio.client.Client``)
with the options of :class:`reel.shared.runtime.config.NatsAuth` — user/password, an nkey seed or a
``.creds`` file, TLS (CA, client certificate and key), the JetStream API prefix of the
client account and the connection's inbox prefix (docs/security.md).

The server answers a publish the connection's user may not make with an asynchronous
``-ERR 'Permissions Violation for Publish to "<subject>"'`` and never replies, so a plain
request would wait for its whole timeout. :class:`ReelConnection` fails every request
in flight to that subject at once with :class:`PermissionDenied` (naming the subject, never
a secret); :func:`fail_if_denied` lets code that publishes and collects replies itself
(batched Direct Get) do the same. A rejected login (or a TLS handshake that fails) during
the first connect raises :class:`ConnectRefused` instead of retrying forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import nats.js
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from reel.shared.core.errors import ReelError
from reel.shared.runtime.config import NatsAuth

log = structlog.get_logger(__name__)

_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"')


class PermissionDenied(ReelError):
    """The connection's NATS user may not publish (or subscribe) on ``subject`` (docs/security.md).

    Attributes: ``subject`` (as the server reported it: lower-cased), ``action`` (``publish`` or
    ``subscription``), ``user`` (the connection's user name, if it has one).
    """

    code = "permission_denied"

    def __init__(self, subject: str, action: str = "publish", user: str | None = None) -> None:
        who = f"NATS user {user!r}" if user else "this NATS connection"
        super().__init__(f"{who} may not {'subscribe to' if action == 'subscription' else 'publish to'} {subject}")
        self.subject, self.action, self.user = subject, action, user


class ConnectRefused(ReelError):
    """The server refused the login (bad or missing credentials) or the TLS handshake failed."""

    code = "connect_refused"


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@`` (comma-separated lists too); never raises (a part
    that does not parse as a URL keeps only what follows its last ``@``)."""
    out = []
    for part in url.split(","):
        try:
            p = urlsplit(part.strip())
            p.port  # noqa: B018  (a bad port raises here, not below)
        except ValueError:
            scheme, sep, rest = part.strip().rpartition("://")
            out.append(f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else part.strip())
            continue
        if p.username or p.password:
            netloc = "***@" + (p.hostname or "") + (f":{p.port}" if p.port else "")
            out.append(urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment)))
        else:
            out.append(part.strip())
    return ",".join(out)


def tls_context(auth: NatsAuth) -> ssl.SSLContext | None:
    """The client TLS context of ``auth`` (CA bundle, client certificate + key), or ``None`` without TLS options.

    Raises:
        ConnectRefused: a file cannot be read as a certificate or key (the message names the file, not its content).
    """
    if not (auth.tls_ca or auth.tls_cert):
        return None
    try:
        ctx = ssl.create_default_context(cafile=auth.tls_ca)
        if auth.tls_cert:
            ctx.load_cert_chain(auth.tls_cert, auth.tls_key)
    except (OSError, ssl.SSLError) as exc:
        names = ", ".join(f for f in (auth.tls_ca, auth.tls_cert, auth.tls_key) if f)
        raise ConnectRefused(f"cannot load the TLS files ({names}): {exc.__class__.__name__}") from None
    return ctx


def connect_options(auth: NatsAuth) -> dict[str, Any]:
    """The ``nats.connect`` keyword arguments for ``auth`` (credentials, TLS, inbox prefix)."""
    opts: dict[str, Any] = {}
    if auth.user:
        opts["user"] = auth.user
        if auth.password is not None:
            opts["password"] = auth.password
    if auth.creds:
        opts["user_credentials"] = auth.creds
    if auth.nkey_seed:
        seed = auth.nkey_seed.strip()
        opts["nkeys_seed_str" if seed.startswith("SU") and "/" not in seed else "nkeys_seed"] = seed
    ctx = tls_context(auth)
    if ctx is not None:
        opts["tls"] = ctx
    if auth.inbox_prefix:
        opts["inbox_prefix"] = auth.inbox_prefix
    return opts


def _fatal_at_connect(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, ssl.SSLError) or "authorization violation" in text or "authentication" in text \
        or type(exc).__name__ == "AuthorizationError"


class ReelConnection(Client):
    """``nats.aio.client.Client`` whose requests fail fast on a permission violation (see module doc).

    Args:
        user: the user name, for error messages.
        js_api_prefix: the default JetStream API prefix of :meth:`jetstream` (the client account's
            imports, docs/security.md); ``None``: ``$JS.API``.
        guard: watch requests for violations (only a connection with credentials can meet one:
            without, requests go straight through, at no cost).
    """

    def __init__(self, *, user: str | None = None, js_api_prefix: str | None = None, guard: bool = True) -> None:
        super().__init__()
        self.reel_user, self.js_api_prefix, self.guard = user, js_api_prefix, guard
        self._waiting: dict[str, set[asyncio.Future[Any]]] = {}
        self._denied_futures: set[asyncio.Future[Any]] = set()
        self.violations: list[PermissionDenied] = []

    def jetstream(self, **opts: Any) -> nats.js.JetStreamContext:
        """A JetStream context; its API prefix defaults to this connection's ``js_api_prefix``."""
        if self.js_api_prefix and "prefix" not in opts and "domain" not in opts:
            opts["prefix"] = self.js_api_prefix
        return super().jetstream(**opts)

    def watch(self, subject: str, fut: asyncio.Future[Any]) -> None:
        """Fail ``fut`` with :class:`PermissionDenied` if the server refuses a publish to ``subject``
        (until ``fut`` is done)."""
        key = subject.lower()
        self._waiting.setdefault(key, set()).add(fut)

        def forget(f: asyncio.Future[Any]) -> None:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.discard(f)
                if not waiting:
                    del self._waiting[key]

        fut.add_done_callback(forget)

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5, old_style: bool = False,  # noqa: ASYNC109
                      headers: dict[str, Any] | None = None) -> Msg:
        """:meth:`nats.aio.client.Client.request`, raising :class:`PermissionDenied` at once when refused."""
        if not self.guard:
            return await super().request(subject, payload, timeout, old_style, headers)
        req = asyncio.ensure_future(super().request(subject, payload, timeout, old_style, headers))
        self.watch(subject, req)
        try:
            return await req
        except asyncio.CancelledError:
            if req in self._denied_futures:
                self._denied_futures.discard(req)
                raise PermissionDenied(subject, "publish", self.reel_user) from None
            raise

    async def on_error(self, exc: Exception) -> None:
        """The connection's ``error_cb``: permission violations fail their waiters and are logged once each."""
        m = _VIOLATION.search(str(exc).lower())
        if m is None:
            log.warning("nats.error", error=str(exc)[:300])
            return
        action, subject = m.group(1), m.group(2)
        denied = PermissionDenied(subject, action, self.reel_user)
        self.violations.append(denied)
        del self.violations[:-100]
        log.error("nats.permission_denied", action=action, subject=subject, user=self.reel_user)
        for fut in list(self._waiting.get(subject, ())):
            if fut.done():
                continue
            if isinstance(fut, asyncio.Task):
                self._denied_futures.add(fut)
                fut.cancel()
            else:
                fut.set_exception(PermissionDenied(subject, action, self.reel_user))


def fail_if_denied(nc: Client, subject: str, fut: asyncio.Future[Any]) -> None:
    """Fail ``fut`` with :class:`PermissionDenied` if a publish to ``subject`` on ``nc`` is refused
    (no-op for a plain ``Client``)."""
    if isinstance(nc, ReelConnection) and nc.guard:
        nc.watch(subject, fut)


def connection_callbacks(nc: Client, name: str) -> dict[str, Any]:
    """structlog callbacks for a connection's life (``nats.disconnected``, ``nats.reconnected`` with the
    server now in use, ``nats.closed``), in place of nats-py's defaults: one JSON line each, no traceback."""
    async def disconnected() -> None:
        if not nc.is_closed:  # a close of our own is ``nats.closed``
            log.warning("nats.disconnected", connection=name)

    async def reconnected() -> None:
        log.warning("nats.reconnected", connection=name, server=redact_url(str(nc.connected_url.geturl()))
                    if nc.connected_url else None)

    async def closed() -> None:
        log.info("nats.closed", connection=name)

    return {"disconnected_cb": disconnected, "reconnected_cb": reconnected, "closed_cb": closed}


class _ToStructlog(logging.Handler):
    """nats-py's own ``logging`` lines (its read loop's ``encountered error``, with a traceback) as one
    structlog line each: ``nats.client_error`` with the error's type and message."""

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        log.error("nats.client_error", message=record.getMessage()[:300],
                  error=None if exc is None else f"{exc.__class__.__name__}: {str(exc)[:300]}")


def bridge_client_logger() -> None:
    """Route the ``nats`` stdlib logger through structlog, once per process (idempotent)."""
    logger = logging.getLogger("nats")
    if not any(isinstance(h, _ToStructlog) for h in logger.handlers):
        logger.addHandler(_ToStructlog(level=logging.WARNING))
        logger.propagate = False


async def open_connection(servers: list[str], auth: NatsAuth, *, name: str, **options: Any) -> ReelConnection:
    """Connect to ``servers`` with ``auth`` (further ``options`` go to ``nats.connect``).

    Raises:
        ConnectRefused: the server refused the credentials, or TLS failed, on the first connect.
        nats.errors.NoServersError, OSError: as ``nats.connect``.
    """
    nc = ReelConnection(user=auth.user, js_api_prefix=auth.js_api_prefix, guard=auth.configured)
    refused: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def error_cb(exc: Exception) -> None:
        if not nc.is_connected and _fatal_at_connect(exc):
            if not refused.done():
                refused.set_result(exc)
            return
        await nc.on_error(exc)

    bridge_client_logger()
    callbacks = connection_callbacks(nc, name)
    connecting: asyncio.Future[Any] = asyncio.ensure_future(
        nc.connect(servers=servers, name=name, error_cb=error_cb, **{**callbacks, **options}, **connect_options(auth)))
    await asyncio.wait([connecting, refused], return_when=asyncio.FIRST_COMPLETED)
    if connecting.done():
        connecting.result()
        return nc
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await connecting
    with contextlib.suppress(Exception):
        await nc.close()
    exc = refused.result()
    what = "TLS handshake failed" if isinstance(exc, ssl.SSLError) else "the server refused the login"
    who = f" as NATS user {auth.user!r}" if auth.user else (" (no credentials given)" if not auth.configured else "")
    raise ConnectRefused(f"{what}{who} at {redact_url(','.join(servers))}: {str(exc)[:200]}")
