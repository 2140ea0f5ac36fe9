"""``reel pending``, ``approve``, ``reject``, ``answer``: human input to runs that wait for it (docs/workflow.md).

A run whose agent calls a tool that needs approval, or asks the user (``ask_user``),
rests in ``awaiting_input`` once nothing else of it can run. ``reel pending`` lists the
open requests; ``approve`` / ``reject`` / ``answer`` send one answer on
``<ns>.cmd.respond`` (the cancel service handles it) and then, unless ``--no-wait``,
follow the run as ``reel run`` does until it rests again — finished (exit 0, 3, 4), or
waiting for another answer (exit 6, its requests printed with how to answer them).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.table import Table

from reel.services.cli.console import EXIT, CliError, JsonOut, Namespace, NatsUrl, console, run_async
from reel.services.cli.embed import SERVICES, session, wait_states
from reel.services.cli.runs import exit_code, follow
from reel.services.timeline.render import open_requests, print_timeline, print_waiting
from reel.shared.runtime.clock import now_ms

By = typer.Option("", "--by", help="who answers (recorded with the answer)")
NoWait = typer.Option(False, "--no-wait", help="send the answer and exit; do not follow the run")
Timeout = typer.Option(300.0, "--timeout", help="seconds to follow the run after the answer")


def pending(json_out: bool = typer.Option(False, "--json", help="JSON: one object per open request"),
            nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """List the runs awaiting input and their open requests (with how to answer each)."""
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            found = [r for rid in await s.client.log.list_runs() for r in open_requests(await s.client.log.load(rid))]
        if json_out:
            sys.stdout.write(json.dumps(found) + "\n")
            return 0
        if not found:
            console.print("no open input requests")
            return 0
        table = Table()
        for col in ("run", "request", "status", "call", "asks", "asked", "deadline"):
            table.add_column(col, overflow="fold")
        for r in found:
            what = f"answer: {r['question']}" if r["kind"] != "approval" else \
                f"approve: {r['tool']}({r['arguments'] or ''})"
            left = None if r["deadline_ms"] is None else (r["deadline_ms"] - now_ms()) / 1000
            deadline = "" if left is None else f"{left:.0f} s → {r['default']}"
            table.add_row(r["run_id"], r["request_id"], r["run_status"], r["step_id"], what, r["asked"], deadline)
        console.print(table)
        console.print("answer with: reel approve RUN REQUEST [--args JSON]  |  reel reject RUN REQUEST --note WHY"
                      "  |  reel answer RUN REQUEST TEXT", markup=False, highlight=False)
        return 0

    run_async(body(), json_out=json_out)


SAID = {"approve": "approved", "reject": "rejected", "answer": "answered"}


def _respond(nats_url: str | None, namespace: str, run_id: str, request_id: str, decision: str, *, wait: bool,
             timeout_s: float, json_out: bool = False, **fields: Any) -> None:
    """The body of ``approve`` / ``reject`` / ``answer``: send one answer (``fields``: the decision's own —
    ``arguments``, ``note``, ``text`` — and ``by``), print one sentence saying what was answered (``json_out``:
    the reply as one JSON line), then unless not ``wait``
    follow the run until it rests.

    With ``json_out`` exactly one object is printed: the reply (``ok``, ``run_id``, ``status``, ``lsn``,
    ``detail``), and after following also ``run_status``, ``exit`` and ``requests`` (the open ones).

    Raises:
        typer.Exit: the run's exit code (:func:`reel.services.cli.runs.exit_code`; 0 without ``wait``), 1 if the
            answer is refused, 4 if the run is cancelled (nothing to answer), 5 if the run does not rest within
            ``timeout_s`` seconds.
    """
    async def body() -> int:
        async with session(nats_url, namespace, services=SERVICES) as s:
            reply = await s.client.respond(run_id, request_id, decision, **fields)
            if not reply.ok:
                raise CliError(reply.error.message if reply.error else "refused",
                               kind=reply.error.code if reply.error else "refused")
            if reply.detail.get("noop"):  # e.g. the run is cancelled: the answer changed nothing
                reason = str(reply.detail.get("reason") or "the request is closed")
                cancelled = reply.status == "cancelled" or "cancelled" in reason
                raise CliError(f"{'the run is cancelled' if cancelled else reason}: nothing to {decision}",
                               EXIT["cancelled"] if cancelled else 1,
                               kind="run_cancelled" if cancelled else "noop")
            doc = {"ok": True, "run_id": reply.run_id, "status": reply.status, "lsn": reply.lsn,
                   "detail": reply.detail}
            if not json_out:
                console.print(f"{SAID[decision]} request {request_id} of run {run_id}"
                              + (f" (lsn {reply.lsn})" if reply.lsn else "") + f"; run {reply.status or '?'}",
                              markup=False, highlight=False)
            if not wait:
                if json_out:
                    sys.stdout.write(json.dumps(doc) + "\n")
                return 0
            state = await follow(s, run_id, until=(*wait_states(), "awaiting_input"), timeout_s=timeout_s,
                                 history=False, quiet=json_out)
            if state is None:
                raise CliError(f"run {run_id} did not rest within {timeout_s}s (it goes on; `reel show {run_id} -f`)",
                               EXIT["timeout"])
            code = exit_code(state)
            if json_out:  # one object: the answer, then where the run rests
                sys.stdout.write(json.dumps({**doc, "run_status": state.status, "exit": code,
                                             "requests": open_requests(state)}) + "\n")
            elif state.status == "awaiting_input":
                print_waiting(console, state)
            else:
                print_timeline(console, state, None, await s.workflow(state))
            return code

    run_async(body(), json_out=json_out)


def approve(run_id: str = typer.Argument(...), request_id: str = typer.Argument(...),
            args: str | None = typer.Option(None, "--args", help="JSON object: run the tool with these arguments"),
            by: str = By, no_wait: bool = NoWait, timeout: float = Timeout, json_out: bool = JsonOut,
            nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Approve a tool call that waits for approval (optionally with edited arguments); then follow the run."""
    try:
        arguments = json.loads(args) if args is not None else None
    except ValueError as exc:
        raise typer.BadParameter(f"--args is not JSON: {exc}") from None

    _respond(nats_url, namespace, run_id, request_id, "approve", wait=not no_wait, timeout_s=timeout,
             json_out=json_out, arguments=arguments, by=by)


def reject(run_id: str = typer.Argument(...), request_id: str = typer.Argument(...),
           note: str = typer.Option(..., "--note", help="why: the model reads it as the call's error result"),
           by: str = By, no_wait: bool = NoWait, timeout: float = Timeout, json_out: bool = JsonOut,
           nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Reject a tool call (or decline a question) with a note the model sees; then follow the run."""
    _respond(nats_url, namespace, run_id, request_id, "reject", wait=not no_wait, timeout_s=timeout,
             json_out=json_out, note=note, by=by)


def answer(run_id: str = typer.Argument(...), request_id: str = typer.Argument(...),
           text: str = typer.Argument(..., help="the answer: the ask_user call's result"),
           by: str = By, no_wait: bool = NoWait, timeout: float = Timeout, json_out: bool = JsonOut,
           nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Answer the model's ask_user question; then follow the run."""
    _respond(nats_url, namespace, run_id, request_id, "answer", wait=not no_wait, timeout_s=timeout,
             json_out=json_out, text=text, by=by)
