"""What ``reel ui --allow-actions`` sends: the CLI's commands, as the operator the UI was started as.

:class:`Actions` is the UI's only way to change a run. Each method sends exactly the command the CLI sends —
``reel approve/reject/answer`` (``<ns>.cmd.respond``), ``reel cancel`` (``<ns>.cmd.cancel``), ``reel rewind
--at-step`` (``<ns>.cmd.rewind``) — through the same :class:`~reel.shared.nats.client.ReelClient` methods, with
``by`` set to the operator's name, so the commit the service makes records who acted (``input_answered.by``,
``run_cancelled.by``, ``branch_forked.by``) and when (its ``at_ms``, the service's clock). The connection's NATS
role decides whether a command may be sent at all (docs/security.md): the read-only ``viewer`` may not, and a
refused publish comes back as an :class:`ActionResult` with the server's reason.

Each method answers an :class:`ActionResult` — never raises for a refusal — with the HTTP status the page is served
with: 200 done; 409 the command changed nothing (the request is closed, the run already ended), 400/404 the
service refused it (its error code and message), 403 the NATS permissions refused it, 504 no service answered
within :data:`COMMAND_TIMEOUT_S` (the command stays queued and is handled when one runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reel.shared.core.errors import ReelError
from reel.shared.core.wire.commands import Reply
from reel.shared.nats.access import PermissionDenied
from reel.shared.nats.client import CommandTimeout, ReelClient

COMMAND_TIMEOUT_S = 30.0
"""How long a form post waits for the service's reply (s) before the page says none answered (the CLI's wait)."""
SAID = {"approve": "approved", "reject": "rejected", "answer": "answered"}
NOT_FOUND = frozenset({"run_not_found", "request_not_found", "branch_not_found", "step_not_found"})


@dataclass(frozen=True)
class ActionResult:
    """What one action did: ``ok`` (a commit was made), the page's HTTP ``status_code``, one ``message`` (what
    was done, or why nothing was), the error ``code`` (``""`` when done) and the commit's ``lsn`` (0: none)."""

    ok: bool
    status_code: int
    message: str
    code: str = ""
    lsn: int = 0


def refused(status_code: int, code: str, message: str) -> ActionResult:
    """An action refused before anything was sent."""
    return ActionResult(ok=False, status_code=status_code, message=message, code=code)


class Actions:
    """The operator's commands over ``client`` (its connection's NATS role), each recorded ``by=operator``."""

    def __init__(self, client: ReelClient, operator: str, *, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self._client, self.operator, self._timeout_s = client, operator, timeout_s

    async def respond(self, run_id: str, request_id: str, decision: str, *, arguments: dict[str, Any] | None = None,
                      note: str = "", text: str = "") -> ActionResult:
        """``reel approve`` (``arguments``: edited ones; ``None``: the model's), ``reel reject --note``, ``reel
        answer TEXT`` of request ``request_id``."""
        sent = await self._send(self._client.respond(run_id, request_id, decision, arguments=arguments, note=note,
                                                     text=text, by=self.operator, timeout_s=self._timeout_s))
        if isinstance(sent, ActionResult):
            return sent
        if sent.detail.get("noop"):
            reason = str(sent.detail.get("reason") or "the request is closed")
            return ActionResult(ok=False, status_code=409, code="noop", message=f"nothing to {decision}: {reason}")
        return ActionResult(ok=True, status_code=200, lsn=int(sent.lsn),
                       message=f"{SAID.get(decision, decision)} request {request_id} of run {run_id} by "
                               f"{self.operator} (lsn {sent.lsn}); run {sent.status or '?'}")

    async def cancel(self, run_id: str, reason: str = "") -> ActionResult:
        """``reel cancel RUN --reason``."""
        sent = await self._send(self._client.cancel(run_id, reason, by=self.operator, timeout_s=self._timeout_s))
        if isinstance(sent, ActionResult):
            return sent
        if sent.detail.get("noop"):
            return ActionResult(ok=False, status_code=409, code="noop",
                           message=f"run {run_id} not cancelled: {sent.detail.get('reason') or sent.status}")
        return ActionResult(ok=True, status_code=200, lsn=int(sent.lsn),
                       message=f"run {run_id} cancelled by {self.operator} at lsn {sent.lsn} "
                               f"(was {sent.detail.get('previous_status')})")

    async def rewind(self, run_id: str, *, at_step: str, branch: str | None = None,
                     idempotency_key: str | None = None) -> ActionResult:
        """``reel rewind RUN --at-step STEP [--branch B] [--key K]`` (the form's key makes a repeated post —
        a double click, a reload — find the branch the first one made)."""
        sent = await self._send(self._client.rewind(run_id, at_step=at_step, branch=branch,
                                                    idempotency_key=idempotency_key, by=self.operator,
                                                    timeout_s=self._timeout_s))
        if isinstance(sent, ActionResult):
            return sent
        made = (f"by {self.operator} (lsn {sent.lsn}); the run continues on it" if sent.created is not False
                else f"(it already existed, made at lsn {sent.lsn}: the same form was posted before)")
        return ActionResult(ok=True, status_code=200, lsn=int(sent.lsn),
                       message=f"run {run_id} rewound from step {at_step}: branch {sent.branch_id} {made}")

    async def _send(self, command: Any) -> Reply | ActionResult:
        """The reply of ``command`` (an awaitable of the client's), or the :class:`ActionResult` of its refusal."""
        try:
            reply: Reply = await command
        except PermissionDenied as exc:
            return refused(403, exc.code, f"the UI's NATS user may not send this command: {exc.message} — start "
                                          "`reel ui --allow-actions` with a role that may (docs/ui.md, Actions)")
        except CommandTimeout:
            return refused(504, CommandTimeout.code, f"no Reel service answered within {self._timeout_s:g} s; the "
                                                     "command stays queued and is handled when one runs (`reel up`)")
        except ReelError as exc:
            return refused(502 if exc.retryable else 400, exc.code, exc.message)
        if not reply.ok:
            code = reply.error.code if reply.error else "refused"
            message = reply.error.message if reply.error else "refused"
            return refused(404 if code in NOT_FOUND else 400, code, message)
        return reply
