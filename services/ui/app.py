"""The ``reel ui`` web app: Starlette routes over a :class:`~reel.services.ui.reader.RunReader` (reads), and with
``--allow-actions`` an :class:`~reel.services.ui.actions.Actions` (the operator's commands; the form posts:
:mod:`~reel.services.ui.forms`).

Pages are rendered on the server (Jinja2, autoescaped: a tool output holding ``<script>``
is text) and work without JavaScript; ``static/ui.js`` enhances them with live updates
over server-sent events (sse-starlette). Routes:

* ``GET /`` — a page of the runs (id, status, outcome, workflow, created, duration, head LSN), at most
  :data:`~reel.services.ui.runindex.PAGE_RUNS`, newest first, from the reader's index; filter
  ``?status=&outcome=&label=&q=``, page ``?before=KEY`` (older) / ``?after=KEY`` (newer): a run's key is the LSN of
  its first commit;
* ``GET /live?tokens=r-…,r-…`` — SSE, one per browser (the pages share it, ``static/live-worker.js``): ``ready``
  ``{tokens}`` once it follows (the runs whose tokens it forwards), ``moved`` ``{run_ids}`` (runs that got a
  commit), ``tokens`` ``{chunks: [{run_id, branch, step, attempt, seq, content?, tool_calls?, done?, …}]}``
  (what the runs' model attempts stream on core NATS, docs/subjects.md);
  ``GET /heads?after=SEQ&limit=N`` — ``{run_id: head_lsn}`` of the runs with a commit above stream sequence
  ``SEQ`` (default: every run; at most ``N``), header ``X-Reel-Applied``: the sequence the answer covers — what a
  page polls instead where it cannot share the stream, each time from the last answer's ``X-Reel-Applied``;
* ``GET /runs/{run_id}/row?status=&outcome=&label=&q=&upper=`` — ``{run_id, key, html}`` (its runs-page row) or
  ``{run_id, remove: true}`` (it does not match the filter, or its key is ``upper`` or more: newer than the page);
* ``GET /runs/{run_id}?branch=`` — a run: failure summary, lineage graph, timeline, partitions, viewers,
  verdicts; ``GET /runs/{run_id}/body?branch=`` — the same page's body alone; ``GET
  /runs/{run_id}/delta?since=LSN&branch=`` — what changed in that body since the render at head ``since``
  (:mod:`reel.services.ui.fragments`), or the whole body when the server no longer has that render;
* ``GET /runs/{run_id}/commits?after=LSN`` — ``{head_lsn, status, outcome, commits: [{lsn, lines}], more}``:
  the commits above ``after`` (at most :data:`MAX_COMMITS`; if ``more``, ``head_lsn`` is the last one's);
* ``GET /runs/{run_id}/blobs/{sha256}?offset=&length=&format=json|html`` — a page of a body the
  run references (bytes ``offset``..; default :data:`~reel.services.ui.pages.PAGE_BYTES`);
  ``?format=chat`` — the body (a chat request or message) as a conversation (:mod:`reel.services.ui.chat`),
  ``&role=user|assistant`` a text body as one such message, ``&fragment=1`` without the page around it; 422
  with the reason if it is not one.
* ``GET /runs/{run_id}/partitions/{step_id}/{attempt}?branch=&fragment=1`` — one attempt's partition in full
  (a page; with ``fragment=1`` the partition alone): what a collapsed one ("same as turn k except …") opens;
* ``POST /runs/{run_id}/actions/respond|cancel|rewind`` — the operator's actions, with ``--allow-actions`` only
  (:mod:`reel.services.ui.forms`; without it each answers 403 and no action is rendered).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
import msgspec
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from reel.services.timeline.render import event_line, how_to_answer
from reel.services.ui import chat, fragments, pages
from reel.services.ui.actions import Actions
from reel.services.ui.forms import LOOPBACK, action_routes, new_token
from reel.services.ui.reader import NotARunId, RunReader, StreamedChunk, check_run_id
from reel.services.ui.runindex import PAGE_RUNS, RunFilter, row_key
from reel.services.ui.runview import DROP_REASONS, RunPage, attempt_anchor, attempt_partition, run_page, step_anchor
from reel.shared.application import workspace
from reel.shared.core.errors import BlobCorrupt, BlobMissing, BlobTimeout, RunNotFound
from reel.shared.core.run import compare as cmp
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.forkedits import describe as describe_edit
from reel.shared.core.run.ids import BranchId
from reel.shared.core.run.integrity import Corruption, RunCorrupt
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.verify.verification import reported_outcome

HERE = Path(__file__).parent
SHA256_HEX = frozenset("0123456789abcdef")
MAX_COMMITS = 500
"""Most commits one ``/runs/<id>/commits`` answer carries (the page asks again from the last one's LSN)."""
MAX_TOKEN_RUNS = 32
"""Most runs one ``/live`` stream forwards streamed tokens of."""
DIFF_CACHE_ENTRIES = 1024
"""Most tool calls' workspace diffs the app keeps (a diff of two snapshots never changes)."""
FileChanges = tuple[workspace.FileChange, ...] | str


@dataclass(frozen=True, slots=True)
class Unshown:
    """Why a run page or feed has no run to show: its HTTP status and a message for the user."""

    status: int
    message: str


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["age"] = lambda ms: pages.age(ms, int(time.time() * 1000))
    env.filters["since"] = lambda ms: pages.duration(int(time.time() * 1000) - ms)
    env.filters["utc"], env.filters["iso_utc"], env.filters["duration"] = pages.utc, pages.iso_utc, pages.duration
    env.filters["row_key"] = row_key
    env.globals["step_anchor"], env.globals["attempt_anchor"] = step_anchor, attempt_anchor
    env.globals["drop_reasons"] = DROP_REASONS
    env.globals["describe_edit"] = describe_edit
    env.filters["kib"] = lambda n: f"{n:,} B" if n < 10240 else f"{n / 1024:,.1f} KiB"
    env.filters["iso"] = lambda ms: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))
    env.globals["how_to_answer"] = how_to_answer
    env.globals["form_key"] = lambda: secrets.token_hex(8)  # a rewind form's idempotency key: one per rendering
    env.globals["actions_by"], env.globals["csrf_token"] = "", ""  # read-only unless create_app says who acts
    return env


def create_app(reader: RunReader, *, page_bytes: int = pages.PAGE_BYTES, server: str = "",
               actions: Actions | None = None, hosts: frozenset[str] | None = LOOPBACK) -> Starlette:
    """The app over ``reader``; viewers page bodies by ``page_bytes`` bytes; ``server`` is shown in the header
    (the NATS server's URL, credentials redacted). With ``actions`` the pages render the operator's forms and the
    action routes send them (:mod:`reel.services.ui.forms`); a post must name one of ``hosts`` as its ``Host``
    (``None``: any)."""
    env = _env()
    token = new_token() if actions is not None else ""
    renders = fragments.Renders()
    diffs: OrderedDict[tuple[str, str], FileChanges] = OrderedDict()  # (before, after) manifest sha256 → changes
    common = {"namespace": reader.namespace, "server": server, "statuses": pages.STATUSES,
              "actions_by": actions.operator if actions is not None else "", "csrf_token": token}

    def html(name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**common, **ctx), status_code=status_code)

    def error(status_code: int, message: str) -> HTMLResponse:
        return html("error.html", status_code, message=message)

    def run_filter(request: Request) -> RunFilter:
        qp = request.query_params
        return RunFilter(status=qp.get("status", ""), outcome=qp.get("outcome", ""), label=qp.get("label", ""),
                         q=qp.get("q", ""))

    async def runs(request: Request) -> Response:
        t0 = time.perf_counter()
        f = run_filter(request)
        try:
            before, after = (_key(request.query_params.get(k)) for k in ("before", "after"))
        except ValueError:
            return error(400, "before and after are run keys (the LSN of a run's first commit)")
        caught_up = await reader.caught_up()
        t1 = time.perf_counter()
        page = reader.index.query(f, before=before, after=after)
        t2 = time.perf_counter()
        filt = {k: v for k, v in (("status", f.status), ("outcome", f.outcome), ("label", f.label), ("q", f.q)) if v}
        indexed, listed = reader.index_progress
        out = html("runs.html", page=page, rows=page.rows, f=f, status=f.status, q=f.q, filt=filt,
                   outcomes=reader.index.outcomes(), caught_up=caught_up, index_ready=reader.index_ready,
                   indexed=indexed, listed=listed, first_page=page.newer is None, page_size=PAGE_RUNS,
                   upper="" if page.newer is None or not page.rows else str(row_key(page.rows[0]) + 1))
        t3 = time.perf_counter()
        out.headers["Server-Timing"] = (f"catchup;dur={(t1 - t0) * 1000:.2f}, index;dur={(t2 - t1) * 1000:.2f}, "
                                        f"render;dur={(t3 - t2) * 1000:.2f}, total;dur={(t3 - t0) * 1000:.2f}")
        return out

    async def live(request: Request) -> Response:
        try:
            token_runs = sorted({check_run_id(r) for r in request.query_params.get("tokens", "").split(",") if r})
        except NotARunId as exc:
            return JSONResponse({"error": f"tokens: {exc}"}, 400)
        if len(token_runs) > MAX_TOKEN_RUNS:
            return JSONResponse({"error": f"tokens: {len(token_runs)} runs, at most {MAX_TOKEN_RUNS}"}, 400)

        async def gen() -> AsyncIterator[ServerSentEvent]:
            merged: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=1000)  # full: the readers queue, then drop

            async def pump(kind: str, q: asyncio.Queue[Any]) -> None:
                while True:
                    await merged.put((kind, await q.get()))

            async with reader.moved_runs() as moved, reader.tokens(token_runs) as streamed:
                pumps = [asyncio.create_task(pump("moved", moved)), asyncio.create_task(pump("tokens", streamed))]
                try:
                    yield ServerSentEvent(event="ready", data=json.dumps({"tokens": token_runs}))
                    while True:
                        got = [await merged.get()]
                        while not merged.empty():
                            got.append(merged.get_nowait())
                        ids = sorted({v for k, v in got if k == "moved"})
                        chunks = [_token(v) for k, v in got if k == "tokens"]
                        if chunks:
                            yield ServerSentEvent(event="tokens", data=json.dumps({"chunks": chunks}))
                        if ids:
                            yield ServerSentEvent(event="moved", data=json.dumps({"run_ids": ids}))
                finally:
                    for t in pumps:
                        t.cancel()

        return EventSourceResponse(gen(), ping=10)

    async def heads(request: Request) -> Response:
        try:
            after = int(request.query_params.get("after", "-1"))
            limit = int(request.query_params.get("limit", "-1"))
        except ValueError:
            return JSONResponse({"error": "after and limit are integers (a stream sequence, a count)"}, 400)
        await reader.caught_up()
        applied = reader.applied  # before reading the rows: every commit up to it is in them
        found = reader.index.heads(after=after)
        if limit >= 0:
            found = dict(list(found.items())[:limit])
        return JSONResponse(found, headers={"X-Reel-Applied": str(applied)})

    async def row(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        f = run_filter(request)
        try:
            upper = _key(request.query_params.get("upper"))
            found = await reader.row(check_run_id(run_id))
        except ValueError as exc:  # NotARunId too
            return JSONResponse({"error": str(exc)}, 400)
        if found is None or not reader.index.matches(found, f) or (upper is not None and row_key(found) >= upper):
            return JSONResponse({"run_id": run_id, "remove": True})
        return JSONResponse({"run_id": run_id, "key": row_key(found),
                             "html": env.get_template("_row.html").render(**common, r=found)})

    async def _load(run_id: str) -> tuple[RunState, Corruption | None] | Unshown:
        """The run's state and, for a run whose log is corrupt past a readable prefix, its corruption (the
        state is that prefix's); or why there is none to show, as (HTTP status, message): 400 for an id that
        is not one, 404 for no such run, 409 for a log corrupt from its first commit."""
        try:
            return await reader.state(run_id), None
        except NotARunId as exc:
            return Unshown(400, str(exc))
        except RunNotFound:
            return Unshown(404, f"no run {run_id!r} in namespace {reader.namespace}")
        except RunCorrupt as exc:
            if exc.state is None:
                return Unshown(409, exc.corruption.describe())
            return exc.state, exc.corruption

    async def _workspace_changes(state: RunState, bid: BranchId) -> dict[tuple[str, int], FileChanges]:
        """Each tool call of the branch that changed its workspace, with what it changed (as ``reel show`` prints
        it); a snapshot pair read once is kept (it never changes)."""
        out: dict[tuple[str, int], FileChanges] = {}
        if reader.blobs is None or not isinstance(state.workspace, BlobRef):
            return out
        for call in workspace.call_snapshots(state, bid):
            key = (call.before.sha256 if call.before is not None else "", call.after.sha256)
            changes = diffs.pop(key, None)
            if changes is None:
                try:
                    changes = tuple(await workspace.call_diff(call, reader.blobs))
                except (BlobMissing, BlobCorrupt, BlobTimeout) as exc:
                    changes = f"its snapshot cannot be read: {exc}"
            diffs[key] = changes
            while len(diffs) > DIFF_CACHE_ENTRIES:
                diffs.popitem(last=False)
            out[(call.step_id, call.attempt)] = changes
        return out

    async def _body(request: Request) -> tuple[RunPage, str, str] | Response:
        """(the page, the branch parameter, the rendered body) of a run page, or the error page."""
        run_id, branch = request.path_params["run_id"], request.query_params.get("branch") or None
        got = await _load(run_id)
        if isinstance(got, Unshown):
            return error(got.status, got.message)
        state, corrupt = got
        if branch is not None and branch not in state.branches:
            return error(404, f"run {run_id} has no branch {branch!r} (branches: {', '.join(state.branches)})")
        p = run_page(state, branch, corrupt=corrupt,
                     workspace=await _workspace_changes(state, BranchId(branch) if branch else state.active_branch))
        body = env.get_template("_run_body.html").render(**common, p=p, branch_param=branch or "",
                                                         page_bytes=page_bytes)
        return p, branch or "", body

    def _remember(state: RunState, branch: str, body: str) -> list[fragments.Fragment]:
        parts = fragments.split(body)
        renders.put((state.run_id, branch), state.head_lsn, fragments.manifest(parts))
        return parts

    async def run(request: Request) -> Response:
        got = await _body(request)
        if isinstance(got, Response):
            return got
        p, branch, body = got
        _remember(p.state, branch, body)
        return html("run.html", p=p, body=markupsafe.Markup(body), branch_param=branch, page_bytes=page_bytes)

    async def run_body(request: Request) -> Response:
        got = await _body(request)
        return got if isinstance(got, Response) else HTMLResponse(got[2])

    async def run_delta(request: Request) -> Response:
        try:
            since = int(request.query_params.get("since", "-1"))
        except ValueError as exc:
            return JSONResponse({"error": f"since is an LSN: {exc}"}, 400)
        got = await _body(request)
        if isinstance(got, Response):
            return JSONResponse({"error": "the run page cannot be rendered", "status": got.status_code},
                                got.status_code)
        state, branch, body = got[0].state, got[1], got[2]
        old = renders.get((state.run_id, branch), since)
        d = None if old is None else fragments.delta(old, _remember(state, branch, body))
        if old is None:
            _remember(state, branch, body)
        axis = {"lo": state.created_lsn, "hi": state.head_lsn, "n": max(1, state.head_lsn - state.created_lsn)}
        if d is None:
            return JSONResponse({"head_lsn": state.head_lsn, "axis": axis, "full": body})
        return JSONResponse({"head_lsn": state.head_lsn, "axis": axis, "removed": [list(r) for r in d.removed],
                             "changes": [list(c) for c in d.changes]})

    async def run_partition(request: Request) -> Response:
        run_id, step_id = request.path_params["run_id"], request.path_params["step_id"]
        try:
            attempt = int(request.path_params["attempt"])
        except ValueError as exc:
            return error(400, str(exc))
        got = await _load(run_id)
        if isinstance(got, Unshown):
            return error(got.status, got.message)
        state = got[0]
        bid = request.query_params.get("branch") or state.active_branch
        found = attempt_partition(state, bid, step_id, attempt) if bid in state.branches else None
        if found is None:
            return error(404, f"run {run_id} has no partition of {step_id} #{attempt} on branch {bid}")
        return html("_partition.html" if request.query_params.get("fragment") == "1" else "partition.html",
                    part=found, run_id=run_id, step_id=step_id, attempt=attempt, branch_id=bid)

    async def run_compare(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        got = await _load(run_id)
        if isinstance(got, Unshown):
            return error(got.status, got.message)
        state = got[0]
        given = request.query_params.getlist("branch")
        everyone = cmp.default_branches(state)
        unknown = [b for b in given if b not in state.branches]
        if unknown:
            return error(404, f"run {run_id} has no branch {unknown[0]!r} (branches: {', '.join(everyone)})")
        chosen = [BranchId(b) for b in dict.fromkeys(given)] or everyone
        outputs: dict[BranchId, str | None] = {}
        for b in chosen:
            ref = cmp.final_output_ref(build_episode_view(state, b))
            if ref is None:
                outputs[b] = None
                continue
            try:
                body = (await reader.whole(run_id, ref.sha256))[1]
            except (BlobMissing, BlobCorrupt, BlobTimeout) as exc:
                outputs[b] = f"(its output cannot be read: {exc})"
                continue
            outputs[b] = cmp.answer_text(body) if body is not None else \
                f"(an output of {ref.size_bytes:,} bytes: open it from the run page)"
        try:
            diffs = await workspace.branch_diffs(state, chosen, reader.blobs)
        except (BlobMissing, BlobCorrupt, BlobTimeout) as exc:
            return error(409, f"a workspace snapshot of run {run_id} cannot be read: {exc}")
        c = cmp.compare(state, chosen, outputs, workspaces=diffs)
        return html("compare.html", c=c, run_id=run_id, everyone=everyone, chosen=chosen,
                    columns=pages.compare_columns(c, outputs))

    async def run_commits(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        got = await _load(run_id)
        if isinstance(got, Unshown):
            return JSONResponse({"error": got.message, **({"corrupt": True} if got.status == 409 else {})},
                                got.status)
        state, corrupt = got
        if corrupt is not None:  # the commits feed serves whole logs only
            return JSONResponse({"error": corrupt.describe(), "corrupt": True}, 409)
        new = await reader.commits(run_id, after_lsn=after, upto_lsn=state.head_lsn)
        return JSONResponse({**_commits(state, new[:MAX_COMMITS]), "more": len(new) > MAX_COMMITS})

    async def blob(request: Request) -> Response:
        run_id, sha = request.path_params["run_id"], request.path_params["sha256"]
        q = request.query_params
        as_json = q.get("format") == "json"

        def fail(status_code: int, message: str) -> Response:
            return JSONResponse({"error": message}, status_code) if as_json else error(status_code, message)

        if len(sha) != 64 or not set(sha) <= SHA256_HEX:
            return fail(400, "not a sha256 (64 lower-case hex digits)")
        if q.get("format") == "chat":
            role = q.get("role", "")
            if role not in ("", "user", "assistant"):
                return fail(400, "role is user or assistant")
            return await chat_view(run_id, sha, fragment=q.get("fragment") == "1", fail=fail, role=role)
        try:
            offset, length = int(q.get("offset", "0")), int(q.get("length", str(page_bytes)))
        except ValueError:
            return fail(400, "offset and length are byte counts")
        try:
            page = await reader.blob(run_id, sha, offset, length)
        except NotARunId as exc:
            return fail(400, str(exc))
        except (RunNotFound, BlobMissing) as exc:
            return fail(404, str(exc))
        except (RunCorrupt, BlobCorrupt, BlobTimeout) as exc:
            return fail(502 if isinstance(exc, BlobTimeout) else 409, str(exc))
        if as_json:
            return JSONResponse({"sha256": page.sha256, "media_type": page.media_type, "offset": page.offset,
                                 "end": page.end, "total": page.total, "text": page.text})
        return html("blob.html", run_id=run_id, page=page, length=length)

    async def chat_view(run_id: str, sha: str, *, fragment: bool, fail: Callable[[int, str], Response],
                        role: str = "") -> Response:
        try:
            ref, body = await reader.whole(run_id, sha)
        except NotARunId as exc:
            return fail(400, str(exc))
        except (RunNotFound, BlobMissing) as exc:
            return fail(404, str(exc))
        except (RunCorrupt, BlobCorrupt, BlobTimeout) as exc:
            return fail(502 if isinstance(exc, BlobTimeout) else 409, str(exc))
        convo = None if body is None else chat.as_message(body, role) if role else chat.conversation(body)
        why = ("" if convo is not None else f"{ref.size_bytes:,} bytes: too large to read whole, only paged"
               if body is None else "not a chat request or message")
        return html("_chat.html" if fragment else "chat.html", 200 if convo is not None else 422, run_id=run_id,
                    ref=ref, c=convo, why=why, page_bytes=page_bytes)

    async def favicon(request: Request) -> Response:
        return RedirectResponse("/static/favicon.svg", 301)

    routes = [
        Route("/", runs), Route("/favicon.ico", favicon), Route("/live", live), Route("/heads", heads),
        Route("/runs/{run_id}", run),
        Route("/runs/{run_id}/row", row), Route("/runs/{run_id}/body", run_body),
        Route("/runs/{run_id}/delta", run_delta),
        Route("/runs/{run_id}/commits", run_commits), Route("/runs/{run_id}/compare", run_compare),
        Route("/runs/{run_id}/partitions/{step_id}/{attempt}", run_partition),
        Route("/runs/{run_id}/blobs/{sha256}", blob),
        *action_routes(reader, actions, html, token, hosts),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)


def _token(s: StreamedChunk) -> dict[str, Any]:
    """A streamed message as ``/live`` sends it: the attempt it belongs to and the chunk's fields that are set."""
    return {"run_id": s.run_id, "branch": s.branch_id, "step": s.step_id, "attempt": s.attempt,
            **msgspec.to_builtins(s.chunk)}


def _key(value: str | None) -> int | None:
    """A keyset key from a query parameter (``None`` if absent or empty).

    Raises:
        ValueError: not a non-negative integer.
    """
    if not value:
        return None
    key = int(value)
    if key < 0:
        raise ValueError(f"not a run key: {value!r}")
    return key


def _commits(state: RunState, new: list[tuple[int, Any]]) -> dict[str, Any]:
    """The ``/runs/<id>/commits`` answer: the head, the status, and each new commit's event lines (plain text)."""
    return {"head_lsn": new[-1][0] if new else state.head_lsn, "status": str(state.status),
            "outcome": reported_outcome(state) or "",
            "commits": [{"lsn": lsn, "lines": [event_line(lsn, ev).plain.removeprefix(f"  lsn {lsn:>6}  ")
                                                  for ev in c.events]}
                        for lsn, c in new]}


async def serve(app: Starlette, host: str, port: int, *, started: asyncio.Future[str] | None = None) -> None:
    """Serve ``app`` with uvicorn on host:port (``0``: a free port) until cancelled or Ctrl-C.

    The socket is bound and listening before uvicorn starts, so ``started`` gets the URL
    (``http://host:port``) when a browser can already connect.

    Raises:
        OSError: host:port cannot be bound.
    """
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
        bound = sock.getsockname()
        if started is not None:
            started.set_result(f"http://{f'[{bound[0]}]' if family == socket.AF_INET6 else bound[0]}:{bound[1]}")
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2,
                                access_log=False)
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
