"""``reel fork`` and ``reel compare`` (docs/forks.md).

A fork is a rewind at the turn (the rewind service decides and commits it) whose ``branch_forked`` carries
the edits; the executor applies them when it packs the turn. ``reel fork`` only turns the options into
:mod:`reel.shared.core.run.forkedits` edits and prints the new branch; ``reel compare`` reads the run, asks
:func:`reel.shared.application.comparing.comparison` (which reads the branches' outputs and workspaces) and prints
its answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import typer
from rich.table import Table
from rich.text import Text

from reel.services.cli.console import CliError, JsonOut, Namespace, NatsUrl, console, err_console, run_async
from reel.services.cli.embed import service_active, session
from reel.services.cli.mutating import By, _accepted, _print_reply
from reel.shared.application import comparing
from reel.shared.core.run import compare as cmp
from reel.shared.core.run.forkedits import ContextEdit, Drop, Instructions, Model, Param, Restore, ToolResult, describe
from reel.shared.core.run.ids import ContextItemId, StepId


def _read(path: str, what: str) -> str:
    """The text of ``path``. Raises: CliError (exit 1): unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {what} file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot read {what} file {path!r}: not UTF-8 text (byte {exc.start})") from None


def _pair(text: str, what: str) -> tuple[str, str]:
    """``K=V`` split at the first ``=``. Raises: CliError (exit 2): no ``=`` or an empty key."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise CliError(f"{what} takes KEY=VALUE, got {text!r}", code=2, kind="usage")
    return key, value


def _value(text: str) -> Any:
    """A ``--param`` value: JSON when it parses (``0.2``, ``true``, ``[1]``), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def edits_of(restore: list[str], drop: list[str], instructions: str | None, model: str | None, params: list[str],
             tool_results: list[str]) -> tuple[ContextEdit, ...]:
    """The fork edits the options name, in a stable order (restores, drops, instructions, model, params, results).

    Raises:
        CliError: a malformed ``KEY=VALUE`` (exit 2) or an unreadable file (exit 1).
    """
    out: list[ContextEdit] = [Restore(item=ContextItemId(i)) for i in restore]
    out += [Drop(item=ContextItemId(i)) for i in drop]
    if instructions is not None:
        out.append(Instructions(text=_read(instructions, "instructions")))
    if model is not None:
        out.append(Model(name=model))
    for p in params:
        key, value = _pair(p, "--param")
        out.append(Param(key=key, value=_value(value)))
    for r in tool_results:
        call, path = _pair(r, "--tool-result")
        out.append(ToolResult(call=StepId(call), text=_read(path, "tool result")))
    return tuple(out)


def fork(
    run_id: str = typer.Argument(...),
    at: str = typer.Option(..., "--at", help="the agent turn to re-run (e.g. fix:t1)"),
    restore: list[str] = typer.Option([], "--restore", help="pack this available or dropped item (repeatable)"),
    drop: list[str] = typer.Option([], "--drop", help="leave this item out of the turn (repeatable)"),
    instructions: str | None = typer.Option(None, "--instructions", help="file of the agent's new instructions"),
    model: str | None = typer.Option(None, "--model", help="the model name the requests carry"),
    param: list[str] = typer.Option([], "--param", help="k=v: an extra request field, JSON or text (repeatable)"),
    tool_result: list[str] = typer.Option([], "--tool-result",
                                          help="CALL=FILE: what the model reads as an earlier call's result"),
    branch: str | None = typer.Option(None, "--branch", help="branch to fork (default: active)"),
    key: str | None = typer.Option(None, "--key", help="idempotency key"),
    by: str = By,
    json_out: bool = JsonOut,
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Re-run an agent turn on a new branch with edits to its context; prints the new branch id."""
    async def body() -> int:
        edits = edits_of(restore, drop, instructions, model, param, tool_result)
        async with session(nats_url, namespace, services=("rewind",)) as s:
            reply = _accepted(await s.client.rewind(run_id, at_step=at, branch=branch, idempotency_key=key,
                                                    by=by, edits=edits))
            if json_out:
                _print_reply(reply)
            else:
                console.print(reply.branch_id, markup=False, highlight=False)
                made = "forked" if reply.created is not False else "already forked (same key)"
                err_console.print(f"[dim]run {run_id} {made} at {at} with {len(edits)} edit(s): branch"
                                  f" {reply.branch_id} (lsn {reply.lsn})[/]")
            if not await service_active(s.infra, s.cfg, "executor"):
                err_console.print("[dim]no executor is running: the run continues on the new branch when one"
                                  f" starts (`reel up`); compare with `reel compare {run_id}`[/]")
            return 0

    run_async(body(), json_out=json_out)


def print_comparison(c: cmp.Comparison) -> None:
    """The comparison as tables: branches × verdicts and usage, then where each branch diverges, its fork
    partition's diff and its output diff against the baseline. Branch ids are never cut."""
    table = Table(title=f"run {c.run_id}: {len(c.branches)} branches (baseline {c.baseline})", title_justify="left")
    width = max(len(b.branch_id) for b in c.branches)
    table.add_column("branch", no_wrap=True, min_width=width)
    table.add_column("forked")
    for v in c.verifiers:
        table.add_column(v)
    for col in ("turns", "tokens in", "tokens out", "cost $"):
        table.add_column(col, justify="right")
    table.add_column("edits", overflow="fold")
    for b in c.branches:
        forked = "" if b.parent_branch_id is None else f"{b.parent_branch_id} @ {b.from_step or f'lsn {b.fork_lsn}'}"
        table.add_row(Text(b.branch_id + (" *" if b.active else "")), Text(forked),
                      *(Text(b.verdicts.get(v, "—")) for v in c.verifiers), str(b.turns), str(b.input_tokens),
                      str(b.output_tokens), f"{b.cost_usd:.6f}", Text(", ".join(map(describe, b.edits))))
    console.print(table)
    parts = {p.branch_id: p for p in c.partitions}
    outputs = {o.branch_id: o for o in c.outputs}
    for d in c.divergences:
        where = f"first differs at {d.step_id} ({d.what})" if d.step_id else "never differs in a model step"
        console.print(Text(f"{d.branch_id} vs {c.baseline}: {where}", style="bold"))
        p = parts.get(d.branch_id)
        if p is not None:
            line = (f"  partition of {p.step_id}: no partition on both sides" if p.missing else
                    f"  partition of {p.step_id}: packed +[{', '.join(p.packed_added)}] "
                    f"-[{', '.join(p.packed_removed)}]" + (f", restored [{', '.join(p.restored)}]" if p.restored
                                                            else "")
                    + (f", dropped by fork [{', '.join(p.dropped_by_fork)}]" if p.dropped_by_fork else ""))
            console.print(Text(line))
        o = outputs.get(d.branch_id)
        if o is not None:
            console.print(Text("  final output: the same" if o.same else "  final output differs:"))
            if not o.same:
                console.print(Text("\n".join("    " + x for x in o.diff.splitlines())))
    if c.workspaces is None:
        console.print(Text("workspaces: not compared (this run keeps no workspace per branch)", style="dim"))
    else:
        for ws, diff in c.workspaces.items():
            console.print(Text(f"workspace {ws} vs {c.baseline}:" + ("" if diff else " the same")))
            if diff:
                console.print(Text("\n".join("    " + x for x in diff.splitlines())))


def compare(
    run_id: str = typer.Argument(...),
    branches: list[str] = typer.Argument(None, help="branches to compare, the first the baseline (default: all)"),
    json_out: bool = typer.Option(False, "--json", help="print the comparison as one JSON object"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Compare branches of a run: verdicts, turns, tokens, cost, where they diverge, the fork's partition diff and
    the final outputs' diff."""
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            state = await s.client.log.load(run_id)
            try:
                chosen = comparing.chosen_branches(state, branches or [])
            except comparing.UnknownBranch as exc:
                raise CliError(str(exc), kind="branch_not_found") from None
            found = await comparing.comparison(state, chosen, s.client.blobs)
        if json_out:
            sys.stdout.write(msgspec.json.encode(found).decode() + "\n")
        else:
            print_comparison(found)
        return 0

    run_async(body(), json_out=json_out)
