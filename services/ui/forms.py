"""The action routes of ``reel ui --allow-actions``: form posts, checked against cross-site forgery, sent as
:class:`~reel.services.ui.actions.Actions` commands.

Routes (``POST`` only: a ``GET`` is 405, so no link, image or prefetch can act):

* ``POST /runs/{run_id}/actions/respond`` — ``request_id``, ``decision`` (``approve``/``reject``/``answer``),
  ``arguments`` (approve: the JSON object the tool runs with; the model's own when unchanged), ``note``
  (reject), ``text`` (answer);
* ``POST /runs/{run_id}/actions/cancel`` — ``reason``;
* ``POST /runs/{run_id}/actions/rewind`` — ``at_step``, ``branch`` (default the active one), ``key`` (the
  form's idempotency key).

Every post carries ``csrf_token``: a secret drawn once per ``reel ui`` process (:func:`new_token`) and written
into each form it renders. Another site cannot read the UI's pages (no CORS), so it cannot learn the token, and
a post without it — or with another process's — is refused. Besides the token, a post whose ``Origin`` is not
the UI's own (``http://<Host>``), or whose ``Host`` is not one the UI listens as (:func:`allowed_hosts`: a
DNS-rebinding page names its own host), is refused. Starlette ships no CSRF protection, and the middleware
packages for it read the token from a request header only, which a plain HTML form cannot send — hence this
check over Starlette's own form parsing.

Each answer is an HTML page (``action.html``) with the HTTP status of the
:class:`~reel.services.ui.actions.ActionResult`: 200 done, 403 refused here or by the NATS permissions (with the
reason), 400/404/409 refused by the service, 413 a body over :data:`MAX_FORM_BYTES`, 504 no service answered.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reel.services.timeline.render import open_requests
from reel.services.ui.actions import ActionResult, Actions, refused
from reel.services.ui.reader import NotARunId, RunReader, check_run_id
from reel.shared.core.errors import RunNotFound
from reel.shared.core.run.integrity import RunCorrupt

TOKEN_FIELD = "csrf_token"
MAX_FORM_BYTES = 1024 * 1024 + 64 * 1024
"""Largest form body accepted (bytes): a command is at most 1 MiB (edited arguments included)."""
OFF = ("actions are off: this UI was started without --allow-actions (start `reel ui --allow-actions` to approve, "
       "reject, answer, cancel or rewind from it)")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})

Render = Callable[..., Response]
"""``render(template, status_code, **ctx)``: the app's HTML page."""


def new_token() -> str:
    """A fresh form token (256 random bits, URL-safe text): drawn once per process."""
    return secrets.token_urlsafe(32)


def allowed_hosts(host: str, more: Iterable[str] = ()) -> frozenset[str] | None:
    """The ``Host`` names a post may carry when the UI listens on ``host``: the loopback names for a loopback
    address, ``host`` itself for another one, and each of ``more`` (``--allowed-host``: a proxy's name); ``None``
    (any) for every interface (``0.0.0.0``, ``::``)."""
    name = host.strip("[]").lower()
    extra = frozenset(_hostname(m) for m in more if m.strip())
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return (LOOPBACK if name == "localhost" else frozenset({name})) | extra
    if addr.is_unspecified:
        return None
    return (LOOPBACK | {name} if addr.is_loopback else frozenset({name})) | extra


def _hostname(host_header: str) -> str:
    """``Host`` without its port, lower-case (``[::1]:8765`` → ``::1``)."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def check_post(request: Request, form: FormData, token: str, hosts: frozenset[str] | None) -> ActionResult | None:
    """Why this post may not act (an :class:`ActionResult`, 403), or ``None``: the form's token is this process's,
    its ``Origin`` (when sent) is the UI's own, and its ``Host`` is one the UI listens as."""
    sent = form.get(TOKEN_FIELD)
    if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), token.encode()):
        return refused(403, "csrf_token", "the form carries no valid token of this UI (a post from another page or "
                                          "site, or this UI was restarted since the page was loaded: reload it)")
    host = request.headers.get("host", "")
    if hosts is not None and _hostname(host) not in hosts:
        return refused(403, "host_refused", f"this UI does not answer actions for host {host[:100]!r}")
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{host}":
        return refused(403, "origin_refused", f"a post from origin {origin[:100]!r} may not act on this UI")
    return None


def _arguments(raw: str, model: str | None) -> dict[str, Any] | ActionResult | None:
    """Approve's ``arguments`` field: ``None`` (the model's) if empty or equal to the model's ``model`` JSON, else
    the edited object, or an :class:`ActionResult` (400) if it is not a JSON object."""
    if not raw.strip():
        return None
    try:
        edited = json.loads(raw)
    except ValueError as exc:
        return refused(400, "invalid_arguments", f"the edited arguments are not JSON: {exc}")
    if not isinstance(edited, dict):
        return refused(400, "invalid_arguments", "the edited arguments must be a JSON object")
    try:
        same = model is not None and json.loads(model) == edited
    except ValueError:
        same = False
    return None if same else edited


def action_routes(reader: RunReader, actions: Actions | None, render: Render, token: str,
                  hosts: frozenset[str] | None) -> list[Route]:
    """The three ``POST`` routes (see the module doc); with ``actions`` ``None`` each answers 403 and why."""

    async def act(request: Request, kind: str) -> Response:
        run_id = request.path_params["run_id"]
        result = await _act(request, kind, run_id)
        return render("action.html", result.status_code, result=result, kind=kind, run_id=run_id)

    async def _act(request: Request, kind: str, run_id: str) -> ActionResult:
        if actions is None:
            return refused(403, "actions_off", OFF)
        try:
            check_run_id(run_id)
        except NotARunId as exc:
            return refused(400, "invalid_run_id", str(exc))
        if int(request.headers.get("content-length") or 0) > MAX_FORM_BYTES:
            return refused(413, "too_large", f"the form is over {MAX_FORM_BYTES} bytes")
        async with request.form(max_files=0, max_fields=16) as form:
            bad = check_post(request, form, token, hosts)
            if bad is not None:
                return bad
            field = {k: v for k, v in form.items() if isinstance(v, str)}
        if kind == "cancel":
            return await actions.cancel(run_id, field.get("reason", ""))
        if kind == "rewind":
            step = field.get("at_step", "")
            if not step:
                return refused(400, "invalid_command", "rewind needs the step to re-run from (at_step)")
            key = field.get("key")  # one per rendered form, whose buttons name their steps: a key per step
            return await actions.rewind(run_id, at_step=step, branch=field.get("branch") or None,
                                        idempotency_key=f"ui:{key}:{step}" if key else None)
        return await _respond(run_id, field)

    async def _respond(run_id: str, field: dict[str, str]) -> ActionResult:
        assert actions is not None
        request_id, decision = field.get("request_id", ""), field.get("decision", "")
        if not request_id or decision not in ("approve", "reject", "answer"):
            return refused(400, "invalid_command", "respond needs request_id and a decision: approve, reject or "
                                                   "answer")
        arguments: dict[str, Any] | None = None
        if decision == "approve" and field.get("arguments", "").strip():
            try:
                state = await reader.state(run_id)
            except RunNotFound:
                return refused(404, "run_not_found", f"no run {run_id!r} in namespace {reader.namespace}")
            except RunCorrupt as exc:
                return refused(409, "run_corrupt", exc.corruption.describe())
            model = next((r["arguments"] for r in open_requests(state) if r["request_id"] == request_id), None)
            parsed = _arguments(field["arguments"], model)
            if isinstance(parsed, ActionResult):
                return parsed
            arguments = parsed
        return await actions.respond(run_id, request_id, decision, arguments=arguments,
                                     note=field.get("note", ""), text=field.get("text", ""))

    async def respond(request: Request) -> Response:
        return await act(request, "respond")

    async def cancel(request: Request) -> Response:
        return await act(request, "cancel")

    async def rewind(request: Request) -> Response:
        return await act(request, "rewind")

    return [Route("/runs/{run_id}/actions/respond", respond, methods=["POST"]),
            Route("/runs/{run_id}/actions/cancel", cancel, methods=["POST"]),
            Route("/runs/{run_id}/actions/rewind", rewind, methods=["POST"])]
