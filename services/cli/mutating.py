"""``reel cancel`` and ``reel rewind``: the mutating commands (each runs its service in-process if none runs)."""

from __future__ import annotations

import sys

import msgspec
import typer

from reel.services.cli.console import (
    CliError,
    JsonOut,
    Namespace,
    NatsUrl,
    console,
    err_console,
    run_async,
    usage_error,
)
from reel.services.cli.embed import service_active, session
from reel.shared.core.wire.commands import Reply


def _accepted(reply: Reply) -> Reply:
    """``reply`` if the service accepted the command. Raises: CliError (exit 1): its error code and message."""
    if not reply.ok:
        raise CliError(reply.error.message if reply.error else "refused", kind=reply.error.code if reply.error
                       else "refused")
    return reply


def _print_reply(reply: Reply) -> int:
    """Print an accepted ``reply`` as one JSON line; 0. Raises: CliError: see :func:`_accepted`."""
    sys.stdout.write(msgspec.json.encode(_accepted(reply)).decode() + "\n")
    return 0


def _cancelled_line(reply: Reply) -> str:
    """``reel cancel``'s line: the LSN of the cancel and the status it ended, or why nothing was committed."""
    detail = reply.detail
    if detail.get("noop"):
        return f"run {reply.run_id} not cancelled: {detail.get('reason') or reply.status}"
    return f"run {reply.run_id} cancelled at lsn {reply.lsn} (was {detail.get('previous_status')})"


def _rewound_line(reply: Reply, at_step: str | None, at_lsn: int | None) -> str:
    """``reel rewind``'s line: the new branch, where it forked, and the LSN of the fork (none: the key's branch)."""
    where = f"from step {at_step}" if at_step is not None else f"at lsn {at_lsn}"
    made = (f" (lsn {reply.lsn}); the run continues on it" if reply.created is not False
            else f" (it already existed, made at lsn {reply.lsn}: same idempotency key)")
    return f"run {reply.run_id} rewound {where}: branch {reply.branch_id}{made}"


By = typer.Option("", "--by", help="who acts (recorded with the command's commit)")


def cancel(run_id: str = typer.Argument(...), reason: str = typer.Option("", help="why"),
           by: str = By, json_out: bool = JsonOut,
           nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Cancel a run (legal in Pending, Running, Awaiting input, Sleeping and Verifying): one line says what happened."""
    async def body() -> int:
        async with session(nats_url, namespace, services=("cancel",)) as s:
            reply = await s.client.cancel(run_id, reason, by=by)
        if json_out:
            return _print_reply(reply)
        console.print(_cancelled_line(_accepted(reply)), markup=False, highlight=False)
        return 0

    run_async(body(), json_out=json_out)


def rewind(
    run_id: str = typer.Argument(...),
    at_step: str | None = typer.Option(None, "--at-step", help="re-run from this step"),
    at_lsn: int | None = typer.Option(None, "--at-lsn", help="fork at this LSN"),
    branch: str | None = typer.Option(None, "--branch", help="branch to fork (default: active)"),
    key: str | None = typer.Option(None, "--key", help="idempotency key"),
    by: str = By,
    json_out: bool = JsonOut,
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Fork a new branch of a run at a step or an LSN; execution resumes on it."""
    if (at_step is None) == (at_lsn is None):
        usage_error("give exactly one of --at-step or --at-lsn", json_out=json_out)

    async def body() -> int:
        async with session(nats_url, namespace, services=("rewind",)) as s:
            reply = _accepted(await s.client.rewind(run_id, at_step=at_step, at_lsn=at_lsn, branch=branch,
                                                    idempotency_key=key, by=by))
            if json_out:
                _print_reply(reply)
            else:
                console.print(_rewound_line(reply, at_step, at_lsn), markup=False, highlight=False)
            if not await service_active(s.infra, s.cfg, "executor"):
                err_console.print("[dim]no executor is running: the run continues on the new branch when one"
                                  " starts (`reel up`, or `reel serve executor`);"
                                  f" watch it with `reel show {run_id} --follow`[/]")
            return 0

    run_async(body(), json_out=json_out)
