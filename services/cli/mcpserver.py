"""Reel as an MCP server (``reel mcp``, docs/integrations.md "Reel as an MCP server"), on the ``mcp`` SDK's
``MCPServer``.

:func:`build` makes the server over one connection's clients: the CLI's
:class:`~reel.shared.nats.client.ReelClient` (the commands on NATS subjects, the run read from its log) and the
Python API's :class:`~reel.Client` over the same connection (its run handles: results, pending requests, answers,
rewinds, cancels). Each MCP tool is one of those calls; nothing here sends a command of its own. The connection is
the one ``reel`` commands make (``--auth`` → the ``client`` role), so the server may do what a client may, no more.

Tools: ``list_workflows``, ``list_runs``, ``start_workflow``, ``follow_run`` (waits, sending a progress
notification per batch of commits), ``read_timeline``, ``get_verdicts``, ``list_pending``, ``answer_request``,
``rewind_run``, ``fork_run``, ``compare_branches``, ``cancel_run``. A refusal (an unknown run, a closed
request…) is the tool's error result (``isError``), its text ``code: message``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from rich.console import Console

from reel._client import RESTING, Client, RunHandle
from reel.services.timeline.render import event_line, open_requests, print_timeline
from reel.shared.application import comparing
from reel.shared.core.errors import ReelError, WorkflowInvalid
from reel.shared.core.run.events import Commit
from reel.shared.core.run.forkedits import ContextEdit, Drop, Instructions, Model, Param, Restore, ToolResult
from reel.shared.core.run.ids import BranchId, ContextItemId, StepId
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.workflow.spec import WorkflowSpec, load_workflow, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.nats.micro import version

T = TypeVar("T")

WORKFLOW_SUFFIXES = (".yaml", ".yml", ".json")
SCAN_DEPTH = 3
"""How deep under a workflow root ``list_workflows`` looks (the root's own files are depth 1)."""
SCAN_FILES = 500
"""The most files ``list_workflows`` reads per root."""
MAX_COMMITS = 200
"""The most commits one ``follow_run`` / ``read_timeline`` answer carries (the latest: ``truncated`` says so)."""
LIST_RUNS_MAX = 500

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)

RunId = Annotated[str, Field(description="the run's id (r-…)")]
By = Annotated[str, Field(description="who acts (recorded with the commit); empty: nobody named")]


async def _reel(call: Awaitable[T]) -> T:
    """``await call``; a Reel refusal becomes the tool's error result (``code: message``)."""
    try:
        return await call
    except ReelError as exc:
        raise ToolError(f"{exc.code}: {exc.message}") from None


def _plain(value: Any) -> dict[str, Any]:
    """A reply or result as a JSON-ready mapping."""
    out: dict[str, Any] = msgspec.to_builtins(value, str_keys=True)
    return out


def _commit_doc(lsn: int, commit: Commit) -> dict[str, Any]:
    """One commit as the tools show it: its LSN, writer, and one line per event (as ``reel run`` prints them)."""
    lines = []
    for ev in commit.events:
        text = event_line(lsn, ev).plain.split(None, 2)[2:]  # drop the "lsn N" prefix
        lines.append(text[0] if text else type(ev).__name__)
    return {"lsn": lsn, "writer": commit.writer, "events": lines}


def _capped(commits: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    return (commits[-MAX_COMMITS:], True) if len(commits) > MAX_COMMITS else (commits, False)


def _steps(state: RunState, branch: str | None) -> list[dict[str, Any]]:
    view = build_episode_view(state, BranchId(branch) if branch else None)
    return [{"step_id": s.step_id, "kind": s.kind, "status": s.status, "attempts": len(s.attempts),
             **({"tool": s.tool_name} if s.tool_name else {}),
             **({"error_kind": s.error_kind} if s.error_kind else {})} for s in view.steps]


def _timeline_text(state: RunState, branch: str | None, spec: WorkflowSpec | None) -> str:
    """The timeline ``reel show`` prints, as plain text."""
    out = Console(record=True, width=160, color_system=None, file=io.StringIO())
    print_timeline(out, state, branch, spec)
    return out.export_text()


class WorkflowRoots:
    """The folders ``list_workflows`` lists and ``start_workflow`` starts files from (``reel mcp --workflows``)."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = [r.resolve() for r in roots]

    def files(self) -> list[tuple[Path, Path]]:
        """``(root, file)`` of every workflow-like file, in order, at most :data:`SCAN_DEPTH` deep, no hidden
        folder."""
        found: list[tuple[Path, Path]] = []
        for root in self.roots:
            seen = 0
            for dirpath, dirnames, filenames in os.walk(root):
                depth = len(Path(dirpath).relative_to(root).parts)
                dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in (
                    "node_modules", "__pycache__") and depth + 1 < SCAN_DEPTH)
                for name in sorted(filenames):
                    if name.endswith(WORKFLOW_SUFFIXES) and seen < SCAN_FILES:
                        seen += 1
                        found.append((root, Path(dirpath) / name))
        return found

    def resolve(self, path: str) -> Path:
        """``path`` (relative to a root, or absolute) as a file inside one of the roots.

        Raises:
            WorkflowInvalid: it is outside every root, or no such file.
        """
        candidates = [Path(path)] if os.path.isabs(path) else [r / path for r in self.roots]
        for c in candidates:
            p = c.resolve()
            if any(p.is_relative_to(r) for r in self.roots) and p.is_file():
                return p
        raise WorkflowInvalid(f"no workflow file {path!r} under {', '.join(map(str, self.roots))} "
                              "(list_workflows names them)")


def build(rc: ReelClient, client: Client, roots: WorkflowRoots, *,
          workflow_of: Callable[[RunState], Awaitable[WorkflowSpec | None]] | None = None) -> MCPServer:
    """The ``reel mcp`` server over ``rc`` and ``client`` (one connection), starting files under ``roots``;
    ``workflow_of``: a run's stored workflow (the timeline text's tool rows)."""
    s = MCPServer("reel", version=version(), instructions=(
        "Reel runs AI-agent workflows durably. start_workflow starts one (a file list_workflows names, or inline "
        "YAML); follow_run waits for it and returns its commits, its verdicts once it finishes, and its open "
        "input requests while it waits for a human (answer_request answers them)."))

    def handle(run_id: str) -> RunHandle:
        return client.get(run_id)

    @s.tool(annotations=READ)
    def list_workflows() -> dict[str, Any]:
        """The workflow files this server can start (under its --workflows folders): path, name, description."""
        out, skipped = [], 0
        for root, f in roots.files():
            try:
                spec = load_workflow(f, env=os.environ)
            except WorkflowInvalid:
                skipped += 1
                continue
            out.append({"path": str(f.relative_to(root)), "root": str(root), "name": spec.name,
                        "description": spec.description, "steps": len(spec.steps)})
        return {"workflows": out, "not_workflows": skipped}

    @s.tool(annotations=READ)
    async def list_runs(
            limit: Annotated[int, Field(ge=1, le=LIST_RUNS_MAX, description="the most runs to list")] = 50,
            status: Annotated[str | None, Field(description="only runs with this status (e.g. awaiting_input)")]
            = None) -> dict[str, Any]:
        """The namespace's runs, newest first: id, workflow, status, outcome, labels, head LSN."""
        ids = await rc.log.list_runs()
        states = await asyncio.gather(*(rc.log.load(r) for r in ids[-LIST_RUNS_MAX:]), return_exceptions=True)
        runs = [st for st in states if isinstance(st, RunState) and (status is None or st.status == status)]
        runs.sort(key=lambda st: st.created_ms, reverse=True)
        return {"runs": [{"run_id": st.run_id, "workflow": st.workflow_name, "status": str(st.status),
                          "outcome": st.outcome, "labels": dict(st.labels), "created_ms": st.created_ms,
                          "head_lsn": int(st.head_lsn)} for st in runs[:limit]], "total": len(runs)}

    @s.tool()
    async def start_workflow(
            path: Annotated[str | None, Field(description="a workflow file (as list_workflows names it: relative "
                                              "to a root, or absolute inside one)")] = None,
            yaml: Annotated[str | None, Field(description="the workflow itself, YAML or JSON (docs/workflow.md); "
                                              "${NAME} is not expanded")] = None,
            key: Annotated[str | None, Field(description="idempotency key: a repeated start returns the same "
                                             "run")] = None,
            labels: Annotated[dict[str, str] | None, Field(description="the run's labels")] = None,
    ) -> dict[str, Any]:
        """Start a run of a workflow (exactly one of path or yaml); returns at once with the run's id — follow it
        with follow_run."""
        if (path is None) == (yaml is None):
            raise ToolError("usage: give exactly one of path or yaml")
        try:
            target: WorkflowSpec | Path = roots.resolve(path) if path is not None else parse_workflow(yaml or "")
        except ReelError as exc:
            raise ToolError(f"{exc.code}: {exc.message}") from None
        h = await _reel(client.start(target, key=key, labels=labels))
        assert h.started is not None
        return {**_plain(h.started), "next": f"follow_run(run_id={h.run_id!r})"}

    @s.tool(annotations=READ)
    async def follow_run(
            run_id: RunId, ctx: Context,
            since_lsn: Annotated[int, Field(ge=0, description="return the commits after this LSN (0: from the "
                                            "first); pass the last answer's head_lsn to go on")] = 0,
            timeout_s: Annotated[float, Field(gt=0, le=3600, description="the longest wait (s); the run goes on "
                                              "after it")] = 60.0,
    ) -> dict[str, Any]:
        """Wait until the run rests — completed, cancelled, or awaiting input — or timeout_s passes; a progress
        notification per batch of new commits meanwhile. Returns its status, head_lsn, the commits after
        since_lsn, and once it rests its result (outcome, verdicts, output) or its open input requests."""
        state = await _reel(rc.log.load(run_id))
        commits: list[dict[str, Any]] = []
        async with contextlib.aclosing(_watch(rc, run_id, since_lsn)) as watch:
            try:
                async with asyncio.timeout(timeout_s):
                    async for state, new in watch:
                        commits += new
                        if new:
                            last = new[-1]
                            await ctx.report_progress(last["lsn"], None, f"{state.status}: lsn {last['lsn']} "
                                                      f"{'; '.join(last['events'])}"[:300])
                        if state.status in RESTING:
                            break
            except TimeoutError:
                pass
            except ReelError as exc:
                raise ToolError(f"{exc.code}: {exc.message}") from None
        shown, truncated = _capped(commits)
        doc: dict[str, Any] = {"run_id": run_id, "status": str(state.status), "head_lsn": int(state.head_lsn),
                               "rested": state.status in RESTING, "commits": shown, "truncated": truncated}
        if state.status in ("completed", "cancelled"):
            doc["result"] = _plain(await handle(run_id)._result(state))
        elif state.status == "awaiting_input":
            doc["pending"] = open_requests(state)
        return doc

    @s.tool(annotations=READ)
    async def read_timeline(
            run_id: RunId,
            since_lsn: Annotated[int, Field(ge=0, description="the commits after this LSN (0: all)")] = 0,
            branch: Annotated[str | None, Field(description="the branch (default: the active one)")] = None,
    ) -> dict[str, Any]:
        """A run's timeline: its steps with their status and attempts on the branch, its commits after since_lsn
        (one line per event), its branches and verdicts, and the timeline `reel show` prints, as text."""
        state = await _reel(rc.log.load(run_id))
        if branch is not None and branch not in state.branches:
            raise ToolError(f"branch_not_found: run {run_id} has no branch {branch!r} "
                            f"(branches: {', '.join(state.branches)})")
        raw = await _reel(rc.log.read(run_id, from_lsn=since_lsn + 1, upto_lsn=int(state.head_lsn)))
        shown, truncated = _capped([_commit_doc(lsn, c) for lsn, c in raw])
        spec = await workflow_of(state) if workflow_of is not None else None
        return {"run_id": run_id, "workflow": state.workflow_name, "status": str(state.status),
                "head_lsn": int(state.head_lsn), "active_branch": str(state.active_branch),
                "branches": [str(b) for b in state.branches], "steps": _steps(state, branch),
                "verdicts": msgspec.to_builtins(state.verdicts), "commits": shown, "truncated": truncated,
                "text": _timeline_text(state, branch, spec)}

    @s.tool(annotations=READ)
    async def get_verdicts(run_id: RunId) -> dict[str, Any]:
        """A run's result as of now: status, outcome (passed, failed, error, succeeded…), each verifier's verdict,
        its output, usage, and why it did not pass."""
        h = handle(run_id)
        return _plain(await _reel(h._result(await _reel(h.state()))))

    @s.tool(annotations=READ)
    async def list_pending(
            run_id: Annotated[str | None, Field(description="only this run's (default: every run's)")] = None,
    ) -> dict[str, Any]:
        """The open input requests — tool calls waiting for approval, questions waiting for an answer — with the
        request ids answer_request takes."""
        ids = [run_id] if run_id is not None else await rc.log.list_runs()
        found: list[dict[str, Any]] = []
        for rid in ids:
            found += open_requests(await _reel(rc.log.load(rid)))
        return {"requests": found}

    @s.tool()
    async def answer_request(
            run_id: RunId,
            request_id: Annotated[str, Field(description="the request (list_pending names it: q-…)")],
            decision: Annotated[Literal["approve", "reject", "answer"], Field(
                description="approve or reject a tool call waiting for approval; answer a question (reject "
                            "declines it)")],
            text: Annotated[str | None, Field(description="with answer: the answer")] = None,
            note: Annotated[str, Field(description="with reject: why (the model reads it)")] = "",
            arguments: Annotated[dict[str, Any] | None, Field(
                description="with approve: run the tool with these arguments instead")] = None,
            by: By = "",
    ) -> dict[str, Any]:
        """Answer one open input request; the run goes on (follow_run to see where it rests next)."""
        h = handle(run_id)
        if decision == "answer":
            if text is None:
                raise ToolError("usage: decision answer takes text")
            return _plain(await _reel(h.answer(request_id, text, by=by)))
        if decision == "approve":
            return _plain(await _reel(h.approve(request_id, arguments=arguments, note=note, by=by)))
        return _plain(await _reel(h.reject(request_id, note=note, by=by)))

    @s.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True))
    async def rewind_run(
            run_id: RunId,
            at_step: Annotated[str | None, Field(description="re-run from this step (e.g. fix, fix:t2)")] = None,
            at_lsn: Annotated[int | None, Field(ge=1, description="fork after this LSN")] = None,
            branch: Annotated[str | None, Field(description="the branch to fork (default: the active one)")] = None,
            key: Annotated[str | None, Field(description="idempotency key: a repeat returns the same branch")]
            = None,
            by: By = "",
    ) -> dict[str, Any]:
        """Fork a new branch of the run at a step or an LSN (exactly one) and continue the run on it; the old
        branch keeps its history."""
        if (at_step is None) == (at_lsn is None):
            raise ToolError("usage: give exactly one of at_step or at_lsn")
        at: str | int = at_step if at_step is not None else int(at_lsn or 0)
        return _plain(await _reel(handle(run_id).rewind(at=at, branch=branch, key=key, by=by)))

    @s.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True))
    async def fork_run(
            run_id: RunId,
            at: Annotated[str, Field(description="the agent turn to re-run (e.g. fix:t1)")],
            restore: Annotated[list[str], Field(description="context items to pack that the turn left out")] = [],  # noqa: B006
            drop: Annotated[list[str], Field(description="context items to leave out")] = [],  # noqa: B006
            instructions: Annotated[str | None, Field(description="the agent's instructions from this turn on")]
            = None,
            model: Annotated[str | None, Field(description="the model name from this turn on")] = None,
            params: Annotated[dict[str, Any], Field(description="extra request-body fields from this turn on "
                                                    "(e.g. {\"temperature\": 0})")] = {},  # noqa: B006
            tool_results: Annotated[dict[str, str], Field(description="call id (e.g. fix:t1:c1) → the result "
                                                          "text the model reads instead")] = {},  # noqa: B006
            branch: Annotated[str | None, Field(description="the branch to fork (default: the active one)")] = None,
            key: Annotated[str | None, Field(description="idempotency key: a repeat returns the same branch")]
            = None,
            by: By = "",
    ) -> dict[str, Any]:
        """Re-run agent turn `at` on a new branch with its context edited (docs/forks.md) and continue the run
        on it; the old branch keeps its history. Returns the new branch id (compare_branches compares them)."""
        edits: list[ContextEdit] = [*(Restore(item=ContextItemId(i)) for i in restore),
                                    *(Drop(item=ContextItemId(i)) for i in drop)]
        if instructions is not None:
            edits.append(Instructions(text=instructions))
        if model is not None:
            edits.append(Model(name=model))
        edits += [Param(key=k, value=v) for k, v in params.items()]
        edits += [ToolResult(call=StepId(c), text=t) for c, t in tool_results.items()]
        return _plain(await _reel(handle(run_id).fork(at=at, edits=edits, branch=branch, key=key, by=by)))

    @s.tool(annotations=READ)
    async def compare_branches(
            run_id: RunId,
            branches: Annotated[list[str], Field(description="the branches, the first the baseline (default: "
                                                 "every branch, the root first)")] = [],  # noqa: B006
    ) -> dict[str, Any]:
        """Compare branches of a run: verdicts, turns, tokens, cost, the first turn where each diverges from the
        baseline, the fork's partition diff, and the diffs of final outputs and workspaces."""
        state = await _reel(rc.log.load(run_id))
        try:
            chosen = comparing.chosen_branches(state, branches)
        except comparing.UnknownBranch as exc:
            raise ToolError(f"branch_not_found: {exc}") from None
        return _plain(await _reel(comparing.comparison(state, chosen, rc.blobs)))

    @s.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
    async def cancel_run(run_id: RunId, reason: Annotated[str, Field(description="why")] = "",
                         by: By = "") -> dict[str, Any]:
        """Cancel the run (pending, running, awaiting input or verifying; otherwise nothing changes)."""
        return _plain(await _reel(handle(run_id).cancel(reason, by=by)))

    return s


async def _watch(rc: ReelClient, run_id: str, since_lsn: int
                 ) -> AsyncGenerator[tuple[RunState, list[dict[str, Any]]]]:
    """The run's state as it moves, each with the commits it adds after ``since_lsn`` (the first: those already
    there)."""
    first = True
    async for state, new in rc.watch_commits(run_id):
        if first:  # the run as it is: the commits past since_lsn it has already
            first = False
            new = await rc.log.read(run_id, from_lsn=since_lsn + 1, upto_lsn=int(state.head_lsn)) \
                if state.head_lsn > since_lsn else []
        yield state, [_commit_doc(lsn, c) for lsn, c in new if lsn > since_lsn]
