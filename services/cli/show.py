"""``reel show``: a run's timeline (or its EpisodeView as JSON), following it with ``--follow``, and one attempt's
prompt or output body with ``--attempt STEP#N --prompt|--output``."""

from __future__ import annotations

import sys

import msgspec
import typer

from reel.services.cli.console import EXIT, CliError, Namespace, NatsUrl, console, run_async, usage_error
from reel.services.cli.embed import Session, session
from reel.services.cli.runs import follow
from reel.services.timeline.render import print_timeline
from reel.shared.application import workspace
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.ids import BranchId
from reel.shared.core.run.state import RunState
from reel.shared.core.verify.verification import check_verdicts, reported_outcome

REST = ("verifying", "completed", "cancelled", "awaiting_input")
"""``reel show --follow`` stops at these statuses: done, cancelled, waiting for its verifiers or for a human."""


def show(
    run_id: str = typer.Argument(..., help="the run id"),
    branch: str | None = typer.Option(None, help="branch to show (default: the active one)"),
    json_out: bool = typer.Option(False, "--json", help="print the EpisodeView as JSON (with the reported outcome)"),
    follow_: bool = typer.Option(False, "--follow", "-f", help="first print each commit as it lands (and streamed "
                                 "tokens) until the run completes, is cancelled, or waits for its verifiers or for "
                                 "input; then the timeline"),
    timeout: float = typer.Option(3600.0, min=0.1, help="with --follow: seconds to wait (exit 5 when they pass)"),
    attempt: str | None = typer.Option(None, "--attempt", metavar="STEP#N",
                                       help="with --prompt or --output: that attempt of that step (e.g. plan#2, "
                                            "replay:t3#1; STEP alone: its last attempt)"),
    prompt: bool = typer.Option(False, "--prompt", help="print the attempt's prompt body, whole, to stdout"),
    output: bool = typer.Option(False, "--output", help="print the attempt's output body, whole, to stdout"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Print a run's timeline: steps, attempts with status, partitions, tokens, latency, LSNs, branches, verdicts.

    A snapshot of the run as of now; ``--follow`` prints it as it moves first. With
    ``--attempt STEP#N --prompt`` (or ``--output``) it prints only that body, as stored
    (binary-safe: the exact bytes), for piping into a file or a pager.
    """
    if (prompt or output) != (attempt is not None) or (prompt and output):
        usage_error("--attempt takes exactly one of --prompt or --output (and they need --attempt)", json_out=json_out)

    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            state = await s.client.log.load(run_id)
            if follow_:
                rested = await follow(s, run_id, until=REST, timeout_s=timeout)
                if rested is None:
                    raise CliError(f"run {run_id} did not complete within {timeout}s", EXIT["timeout"])
                state = rested
            if branch is not None and branch not in state.branches:
                raise CliError(f"run {run_id} has no branch {branch!r} (branches: {', '.join(state.branches)})")
            if attempt is not None:
                return await _print_body(s, state, branch, attempt, "prompt" if prompt else "output")
            if json_out:
                _print_json(state, branch)
            else:
                print_timeline(console, state, branch, await s.workflow(state))
                await _print_workspace_changes(s, state, BranchId(branch) if branch else state.active_branch)
        return 0

    run_async(body(), json_out=json_out)


def _print_json(state: RunState, branch: str | None) -> None:
    from reel.shared.core.run.views import build_episode_view, serialize_view

    view = build_episode_view(state, BranchId(branch) if branch else None)
    outcome = reported_outcome(state)
    if outcome is not None:
        view = msgspec.structs.replace(view, outcome=outcome, context_checks=tuple(check_verdicts(state)))
    sys.stdout.write(serialize_view(view).decode() + "\n")


async def _print_workspace_changes(s: Session, state: RunState, bid: BranchId) -> None:
    """Each tool call of the branch that changed its workspace (docs/workspaces.md): the paths it added, removed or
    modified, with a unified diff for small text files."""
    if s.client.blobs is None or not isinstance(state.workspace, BlobRef):
        return
    calls = workspace.call_snapshots(state, bid)
    console.print(f"workspace changes on branch {bid}: {len(calls)} tool call(s) changed files")
    for call in calls:
        for change in await workspace.call_diff(call, s.client.blobs):
            console.print(f"  lsn {call.lsn:>6}  {call.step_id}#{call.attempt}  {change.change} {change.path}",
                          markup=False, highlight=False)
            if change.diff:
                console.print("\n".join(f"      {line}" for line in change.diff.splitlines()), markup=False,
                              highlight=False)


def parse_attempt(text: str) -> tuple[str, int | None]:
    """``STEP#N`` → ``(STEP, N)``; ``STEP`` → ``(STEP, None)`` (its last attempt).

    Raises:
        CliError: (exit 2) an empty step or an attempt number that is not a positive integer.
    """
    step, sep, n = text.rpartition("#")
    if not sep:
        return text, None
    if not step or not n.isdigit() or int(n) < 1:
        raise CliError(f"--attempt {text!r}: expected STEP#N with N ≥ 1, e.g. plan#2", 2)
    return step, int(n)


async def _print_body(s: Session, state: RunState, branch: str | None, which: str, kind: str) -> int:
    step_id, n = parse_attempt(which)
    bid = BranchId(branch) if branch else state.active_branch
    attempts = state.branches[bid].attempts.get(step_id, ())  # type: ignore[call-overload]
    if not attempts:
        raise CliError(f"run {state.run_id} has no attempt of step {step_id!r} on branch {bid}",
                       kind="step_not_found")
    chosen = attempts[-1] if n is None else next((a for a in attempts if a.attempt == n), None)
    if chosen is None:
        raise CliError(f"step {step_id} has attempts {', '.join(str(a.attempt) for a in attempts)} on branch {bid},"
                       f" not {n}", kind="attempt_not_found")
    ref = chosen.prompt_ref if kind == "prompt" else chosen.output_ref
    if ref is None:
        why = ("only model attempts have a prompt" if kind == "prompt"
               else f"the attempt is {chosen.status}: only a succeeded attempt has an output")
        raise CliError(f"{step_id}#{chosen.attempt} has no {kind} ({why})")
    if s.client.blobs is None:
        raise CliError("no blob store on this connection")
    await s.client.blobs.get_file(ref, sys.stdout.buffer)  # streamed chunk by chunk, checked: never held whole
    sys.stdout.buffer.flush()
    return 0
