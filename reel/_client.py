"""The Python API's client and run handle, over the one client the CLI uses
(:class:`~reel.shared.nats.client.ReelClient`: commands on NATS subjects, the run read from its log).

``await Client.connect(url)`` talks to a running Reel (``reel up``, a deployment); ``reel.local()`` yields a
client whose server and services run in this process (:mod:`reel._local`). ``await client.start(…)`` returns
a :class:`RunHandle`; the handle waits, follows, answers, rewinds and cancels its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as Nats

from reel._agent import Agent
from reel._errors import RunTimeout, ServiceUnavailable, refused
from reel._tool import FunctionTool
from reel._types import (
    CancelReply,
    CommitEvent,
    Outcome,
    PendingRequest,
    RespondReply,
    RewindReply,
    RunResult,
    RunStatus,
    StartReply,
    Token,
)
from reel.shared.auth.authdir import AuthDir
from reel.shared.core.agent import turnfold
from reel.shared.core.errors import ReelError, WorkflowInvalid
from reel.shared.core.input import requestfold
from reel.shared.core.run.eventfields import Usage, Verdict
from reel.shared.core.run.forkedits import ContextEdit as Edit
from reel.shared.core.run.state import RunState
from reel.shared.core.run.views import EpisodeView, build_episode_view
from reel.shared.core.verify.verification import final_verdicts, reported_outcome
from reel.shared.core.verify.verifiers.context import make_ctx
from reel.shared.core.wire.commands import Reply
from reel.shared.core.wire.livemessages import decode_chunk
from reel.shared.core.wire.subjects import Names
from reel.shared.core.workflow.spec import WorkflowSpec, load_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.infra import Infra, connect, ensure_infra, open_infra
from reel.shared.runtime.config import Config
from reel.shared.runtime.logging import setup_logging

DEFAULT_URL = "nats://127.0.0.1:4222"
"""Where ``Client.connect()`` looks without a URL or ``$NATS_URL``: the server ``reel up`` runs."""

RESTING: tuple[RunStatus, ...] = ("completed", "cancelled", "awaiting_input")
"""The statuses :meth:`RunHandle.result` returns at: finished, or waiting for a human."""

FINISHED: tuple[RunStatus, ...] = ("completed", "cancelled")

Startable = Agent | WorkflowSpec | str | Path
"""What :meth:`Client.start` runs: an :class:`~reel.Agent`, a workflow spec, or a workflow file's path."""


def _source_dir(target: Startable) -> str | None:
    """The absolute folder of a workflow file's path (its ``python:`` tools are looked for there first); ``None``
    for an agent or a spec."""
    return None if isinstance(target, Agent | WorkflowSpec) else os.path.dirname(os.path.abspath(target))


ToolRegistry = dict[str, Callable[..., Any]]
"""``module:function`` → the function an in-process executor calls for that ``python:`` path."""


def quiet_logs(level: str | None = None) -> None:
    """Configure Reel's structlog lines (stderr) unless the application configured structlog itself: ``level`` or
    ``$REEL_LOG_LEVEL``, default ``WARNING`` (a script's output stays its own; a given ``level`` always applies)."""
    if level is not None or not structlog.is_configured():
        setup_logging("reel", level=level or os.environ.get("REEL_LOG_LEVEL", "WARNING"))


class Client:
    """A connection to Reel: starts runs and hands out :class:`RunHandle`\\ s. Use as ``async with``, or
    :meth:`close` it.

    Made by :meth:`connect` (a running Reel) or ``reel.local()`` (in this process; ``served`` is then the
    in-process executor's tool registry, which :meth:`start` adds an agent's function tools to).
    """

    def __init__(self, nc: Nats, cfg: Config, infra: Infra, *, served: ToolRegistry | None = None,
                 owns_connection: bool = True) -> None:
        self._nc, self._cfg, self._infra, self._served = nc, cfg, infra, served
        self._owns = owns_connection
        blobs = JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket, purge=not cfg.auth.configured)
        self._rc = ReelClient(nc, cfg, blobs)

    @classmethod
    async def connect(cls, url: str | None = None, *, namespace: str = "reel", auth: str | Path | None = None,
                      connect_timeout_s: float = 10.0) -> Client:
        """Connect to a running Reel.

        Args:
            url: ``nats://host:port`` (comma-separated for a cluster); default ``$NATS_URL``, else
                :data:`DEFAULT_URL` (``reel up``'s server).
            namespace: the Reel namespace (its streams' prefix; ``reel up --namespace``).
            auth: a ``reel auth init`` directory: connect as its ``client`` role (docs/security.md); without it
                the ``REEL_NATS_*`` variables apply, if set.
            connect_timeout_s: how long to wait for the first connection (s).

        Raises:
            ServiceUnavailable: no server answers within ``connect_timeout_s``; or, with the default URL, the server
                there is not a Reel one for ``namespace`` (it has no event stream: ``reel up`` creates it) — a
                URL given explicitly gets Reel's streams created if missing.
            ReelError: the credentials are refused (``connect_refused``).
        """
        quiet_logs()
        base = Config.from_env(nats_url=url or os.environ.get("NATS_URL") or DEFAULT_URL, names=Names(namespace))
        cfg = AuthDir(Path(auth)).config("client", base) if auth is not None else base
        try:
            nc = await asyncio.wait_for(connect(cfg, name="reel-python"), connect_timeout_s)
        except (TimeoutError, OSError, nats.errors.NoServersError) as exc:
            raise ServiceUnavailable(f"no NATS server answers at {cfg.nats_url} within {connect_timeout_s:g} s "
                                     f"(start `reel up`, or use reel.local()): {type(exc).__name__}") from None
        try:
            if url is None and not os.environ.get("NATS_URL"):
                await _check_reel_server(nc, cfg)
            infra = await (open_infra(nc, cfg) if cfg.auth.configured else ensure_infra(nc, cfg))
        except BaseException:
            await nc.close()
            raise
        return cls(nc, cfg, infra)

    @property
    def namespace(self) -> str:
        """The Reel namespace this client uses."""
        return self._cfg.names.namespace

    @property
    def url(self) -> str:
        """The server's URL."""
        return self._cfg.nats_url

    async def start(self, target: Startable, *, input: str | None = None, key: str | None = None,
                    labels: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> RunHandle:
        """Start a run of ``target``; returns at once with its handle (the run goes on in the executor).

        Args:
            target: an :class:`~reel.Agent`, a ``WorkflowSpec`` (``reel.load_workflow``), or the path of a
                YAML/JSON workflow file (``${NAME}`` expanded from the environment, and its ``python:`` tools
                looked for from its folder up to the project root, as ``reel run`` does; docs/workflow.md).
            input: the task, for an agent (its context item ``task``).
            key: idempotency key: a repeated start with the same key and workflow returns the same run
                (``handle.started.created`` False); another workflow under it raises IdempotencyConflict.
            labels: the run's labels (``name → value``).
            timeout_s: how long to wait for the executor's answer (s).

        Raises:
            WorkflowInvalid: the workflow is invalid (naming the field), or ``input`` given with a non-agent.
            IdempotencyConflict: ``key`` was used for a run of another workflow (that run is untouched).
            CommandTimeout: no executor answered within ``timeout_s`` (the start stays queued).
            ReelError: any other refusal (``code``, ``retryable``).
        """
        spec = self._spec_of(target, input)
        if isinstance(target, Agent) and self._served is not None:
            self._serve(target.functions())
        reply = await self._rc.start(spec, idempotency_key=key, labels=dict(labels or {}), timeout_s=timeout_s,
                                     source_dir=_source_dir(target))
        if not reply.ok or reply.run_id is None:
            raise refused(reply.error)
        started = StartReply(run_id=reply.run_id, created=bool(reply.created), status=reply.status or "pending",
                             lsn=int(reply.lsn))
        return RunHandle(self, reply.run_id, started=started)

    def _spec_of(self, target: Startable, input: str | None) -> WorkflowSpec:
        if isinstance(target, Agent):
            return target.workflow(input)
        if input is not None:
            raise WorkflowInvalid("input= is the task of an Agent; a workflow holds its own context items")
        if isinstance(target, WorkflowSpec):
            return target
        return load_workflow(target, env=os.environ)

    def _serve(self, functions: Mapping[str, FunctionTool[..., Any]]) -> None:
        """Add ``functions`` (path → tool) to the in-process executor's registry.

        Raises:
            WorkflowInvalid: another function is served under one of their ``module:function`` paths.
        """
        assert self._served is not None
        for path, t in functions.items():
            held = self._served.get(path)
            if held is not None and getattr(held, "__wrapped__", held) is not t.fn:
                raise WorkflowInvalid(f"two functions are served as {path!r}: give one of them another name "
                                      f"(@reel.tool(name=…) and a distinct function name)")
            self._served[path] = t.served

    def serve(self, *served: FunctionTool[..., Any] | Agent) -> None:
        """Serve these function tools (and those of these agents) in the in-process executor from now on: a run
        of an earlier ``reel.local(store_dir=…)`` block waiting for them (``reel status``: *runs wait for*)
        goes on at its command's next redelivery (backoff ≤ 30 s).

        Raises:
            WorkflowInvalid: another function is served under one of their ``module:function`` paths.
            TypeError: this client is not of ``reel.local()`` (serve with a ``reel.Worker`` there).
        """
        if self._served is None:
            raise TypeError("Client.serve is for a client of reel.local(); beside a running Reel use reel.Worker")
        for item in served:
            self._serve(item.functions() if isinstance(item, Agent) else {item.path: item})

    def get(self, run_id: str) -> RunHandle:
        """A handle to an existing run (no round trip: its methods raise RunNotFound if there is none)."""
        return RunHandle(self, run_id)

    async def runs(self) -> list[str]:
        """The ids of the namespace's runs."""
        return [str(r) for r in await self._rc.log.list_runs()]

    async def close(self) -> None:
        """Close the connection (a client of ``reel.local()`` is closed by the ``async with``)."""
        if self._owns and not self._nc.is_closed:
            await self._nc.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


async def _check_reel_server(nc: Nats, cfg: Config) -> None:
    """The server at the default URL carries this namespace's event stream (else it is another program's).

    Raises:
        ServiceUnavailable: it has none, or no JetStream.
    """
    try:
        await nc.jetstream().stream_info(cfg.names.events_stream)
    except nats.js.errors.NotFoundError:
        raise ServiceUnavailable(f"the NATS server on {cfg.nats_url} is not a Reel server for namespace "
                                 f"{cfg.names.namespace!r}: it has no stream {cfg.names.events_stream} (`reel up` "
                                 "creates it); pass its URL to use it anyway") from None
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
        raise ServiceUnavailable(f"the NATS server on {cfg.nats_url} has no JetStream (not a Reel server)") from None
    except nats.errors.Error:
        pass  # e.g. a role that may not read stream info: connecting worked, the commands will tell


def _why(state: RunState, view: EpisodeView, verdicts: tuple[Verdict, ...]) -> str | None:
    """One line saying why the run of ``view`` (a view of ``state``) did not pass (:attr:`RunResult.error`)."""
    for step in view.steps:
        if step.status != "failed":
            continue
        rec = turnfold.record(state.branches[view.branch_id], step.step_id) if step.kind == "agent" else None
        if rec is not None and rec.finished is not None and rec.finished.error_kind is not None:
            return f"{step.step_id} failed: {rec.finished.error_kind}: {rec.finished.message.strip()}"
        errors = [a for a in step.attempts if a.error_kind is not None]
        if errors:
            last = errors[-1]
            return f"{step.step_id} failed: {last.error_kind}: {(last.error_message or '').strip()}"
        return f"{step.step_id} failed"
    for v in verdicts:
        if v.status != "pass":
            return f"verdict {v.verifier}: {v.status}: {v.reason}"
    return None


class RunHandle:
    """One run: wait for it, follow it, answer it, rewind it, cancel it.

    Attributes:
        run_id: the run's id (``r-…``); started: the start's reply (``None`` for ``client.get``).
    """

    def __init__(self, client: Client, run_id: str, *, started: StartReply | None = None) -> None:
        self.client, self.run_id, self.started = client, run_id, started

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    @property
    def _rc(self) -> ReelClient:
        return self.client._rc

    async def state(self) -> RunState:
        """The run's folded state now (the engine's own type: status, branches, steps, verdicts).

        Raises:
            RunNotFound: there is no such run.
        """
        return await self._rc.log.load(self.run_id)

    async def status(self) -> RunStatus:
        """The run's status now. Raises: RunNotFound."""
        return cast(RunStatus, str((await self.state()).status))

    async def wait(self, statuses: tuple[RunStatus, ...] = RESTING, *, timeout_s: float | None = 300.0
                   ) -> RunState:
        """Wait until the run's status is one of ``statuses``; its state then.

        Raises:
            RunTimeout: not within ``timeout_s`` seconds (``None``: no limit); the run goes on.
            RunCorrupt: the run's log is corrupt.
        """
        try:
            async with asyncio.timeout(timeout_s):
                async for state in self._rc.watch(self.run_id):
                    if state.status in statuses:
                        return state
        except TimeoutError:
            raise RunTimeout(f"run {self.run_id} is not {' or '.join(statuses)} after {timeout_s} s (it goes on)",
                             run_id=self.run_id) from None
        raise AssertionError("unreachable: watch never ends")

    async def result(self, *, timeout_s: float | None = 300.0) -> RunResult:
        """Wait until the run rests — ``completed``, ``cancelled``, or ``awaiting_input`` (answer it with
        :meth:`approve` / :meth:`reject` / :meth:`answer`, then wait again) — and return where it rests.

        Raises:
            RunTimeout: it did not rest within ``timeout_s`` seconds (``None``: no limit).
        """
        state = await self.wait(RESTING, timeout_s=timeout_s)
        return await self._result(state)

    async def _result(self, state: RunState) -> RunResult:
        branch = state.verifying_branch or state.active_branch
        view = build_episode_view(state, branch)
        output: str | None = None
        with contextlib.suppress(StopIteration, KeyError):
            ctx = make_ctx(view, step=None, blobs=cast(Any, self._rc.blobs), timeout_s=30.0)
            body = await ctx.output()
            output = None if body is None else _answer_text(body, ctx.step_view.kind == "agent")
        verdicts = final_verdicts(state)
        judged = tuple(verdicts[n] for n in state.verifiers if n in verdicts)
        outcome = reported_outcome(state)
        return RunResult(run_id=state.run_id, status=cast(RunStatus, str(state.status)),
                         outcome=cast("Outcome | None", outcome),
                         verdicts=judged, output=output, usage=view.usage if isinstance(view.usage, Usage) else Usage(),
                         branch_id=str(branch), head_lsn=int(state.head_lsn),
                         error=None if outcome in (None, "passed", "succeeded") else _why(state, view, judged))

    async def events(self, *, follow: bool = True) -> AsyncIterator[CommitEvent]:
        """The run's commits from its first, in LSN order, each as it lands; with ``follow`` until the run
        finishes (``completed`` or ``cancelled``; a run awaiting input is followed on), else those so far."""
        async for state, commits in self._rc.watch_commits(self.run_id, history=True):
            for lsn, c in commits:
                yield CommitEvent(lsn=lsn, commit_id=str(c.commit_id), writer=c.writer, events=c.events)
            if not follow or state.status in FINISHED:
                return

    def stream(self) -> TokenStream:
        """The run's streamed model tokens as they arrive (models with ``stream=True``), until it finishes:
        ``async for token in handle.stream()``, or ``async with handle.stream() as tokens:`` to be subscribed
        before anything else happens (then ``async for token in tokens``).

        Tokens are not stored: only fragments published while subscribed are seen (the log keeps each whole
        response). Core NATS, one subscription on ``<ns>.stream.<run_id>.>``.
        """
        return TokenStream(self)

    async def pending(self) -> list[PendingRequest]:
        """The run's open input requests (empty unless it is live and waiting for a human)."""
        out = []
        for r, decl in requestfold.open_calls(await self.state()):
            out.append(PendingRequest(
                run_id=self.run_id, request_id=str(r.request_id), kind=str(r.kind), step_id=str(r.step_id),
                tool=r.tool_name, call_id=r.call_id, question=r.question, asked=r.asked,
                arguments=decl.arguments if decl is not None else None, deadline_ms=r.deadline_ms,
                default=r.default))
        return out

    async def approve(self, request_id: str, *, arguments: Mapping[str, Any] | None = None, note: str = "",
                      by: str = "") -> RespondReply:
        """Approve a tool call waiting for approval (``arguments``: run it with these instead).

        Raises:
            RequestNotFound, RequestAnswered, RunNotFound, InvalidCommand: refused (nothing changed).
        """
        return await self._respond(request_id, "approve", arguments=None if arguments is None else dict(arguments),
                                   note=note, by=by)

    async def reject(self, request_id: str, *, note: str = "", by: str = "") -> RespondReply:
        """Reject a tool call waiting for approval (or decline a question); the model is told ``note``.

        Raises:
            RequestNotFound, RequestAnswered, RunNotFound, InvalidCommand: refused (nothing changed).
        """
        return await self._respond(request_id, "reject", note=note, by=by)

    async def answer(self, request_id: str, text: str, *, by: str = "") -> RespondReply:
        """Answer an ``ask_user`` question; ``text`` is the call's result.

        Raises:
            RequestNotFound, RequestAnswered, RunNotFound, InvalidCommand: refused (nothing changed).
        """
        return await self._respond(request_id, "answer", text=text, by=by)

    async def _respond(self, request_id: str, decision: str, **fields: Any) -> RespondReply:
        reply = self._accepted(await self._rc.respond(self.run_id, request_id, decision, **fields))
        d = reply.detail
        return RespondReply(run_id=self.run_id, request_id=request_id, decision=decision, answered=not d.get("noop"),
                            status=reply.status or "", lsn=int(reply.lsn), reason=str(d.get("reason") or ""))

    async def rewind(self, *, at: str | int, branch: str | None = None, key: str | None = None,
                     by: str = "") -> RewindReply:
        """Fork a new branch and continue the run on it.

        Args:
            at: a step id (re-run from that step: ``"fix"``, ``"fix:t2"``) or an LSN (``int``: fork after it).
            branch: the branch to fork (default: the active one); key: idempotency key (a repeat: same branch).
            by: who rewinds (recorded on the ``branch_forked``; ``""``: nobody named).

        Raises:
            StepNotFound, LsnNotInLineage, RunNotFound, InvalidTransition: refused (nothing changed).
        """
        reply = self._accepted(await self._rc.rewind(
            self.run_id, at_step=at if isinstance(at, str) else None, at_lsn=at if isinstance(at, int) else None,
            branch=branch, idempotency_key=key, by=by))
        return _rewound(self.run_id, reply)

    async def fork(self, *, at: str, edits: Sequence[Edit] = (), branch: str | None = None, key: str | None = None,
                   by: str = "") -> RewindReply:
        """Re-run agent turn ``at`` on a new branch with ``edits`` to its context, and continue the run on it
        (a rewind at that turn whose ``branch_forked`` records the edits; docs/forks.md).

        Args:
            at: the turn to re-run (``"fix:t1"``).
            edits: :mod:`reel.edits` (``Restore(item=…)``, ``Drop(item=…)``, ``Instructions(text=…)``,
                ``Model(name=…)``, ``Param(key=…, value=…)``, ``ToolResult(call=…, text=…)``).
            branch, key, by: as :meth:`rewind`.

        Raises:
            InvalidCommand: an edit that does not fit the turn (code ``invalid_edit``).
            StepNotFound, RunNotFound, InvalidTransition: refused (nothing changed).
        """
        reply = self._accepted(await self._rc.rewind(self.run_id, at_step=at, branch=branch, idempotency_key=key,
                                                     by=by, edits=edits))
        return _rewound(self.run_id, reply)

    async def cancel(self, reason: str = "", *, by: str = "") -> CancelReply:
        """Cancel the run (legal while pending, running, awaiting input or verifying; else nothing changes);
        ``by``: who cancels (recorded on the ``run_cancelled``; ``""``: nobody named).

        Raises:
            RunNotFound: no such run.
        """
        reply = self._accepted(await self._rc.cancel(self.run_id, reason, by=by))
        d = reply.detail
        return CancelReply(run_id=self.run_id, cancelled=not d.get("noop"), status=reply.status or "",
                           lsn=int(reply.lsn), previous_status=str(d.get("previous_status") or ""),
                           reason=str(d.get("reason") or ""))

    def _accepted(self, reply: Reply) -> Reply:
        if not reply.ok:
            raise refused(reply.error, self.run_id)
        return reply


def _rewound(run_id: str, reply: Reply) -> RewindReply:
    d = reply.detail
    return RewindReply(run_id=run_id, branch_id=str(reply.branch_id), created=bool(reply.created),
                       status=reply.status or "", lsn=int(reply.lsn), parent_branch_id=d.get("parent_branch_id"),
                       fork_lsn=d.get("fork_lsn"), from_step=d.get("from_step"))


class TokenStream:
    """The tokens of one run (:meth:`RunHandle.stream`): an async iterator of :class:`~reel.Token`, and an async
    context manager that subscribes on entry and unsubscribes on exit. Iteration ends once the run is
    ``completed`` or ``cancelled``."""

    def __init__(self, handle: RunHandle) -> None:
        self._handle = handle
        self._queue: asyncio.Queue[Token | None] = asyncio.Queue()
        self._sub: Any = None
        self._finished: asyncio.Task[RunState] | None = None
        self._closed = False

    async def _on_msg(self, msg: Any) -> None:
        prefix = self._handle.client._cfg.names.stream_run(self._handle.run_id).removesuffix(">")
        with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError, ValueError):
            chunk = decode_chunk(msg.data)
            branch, step, attempt = str(msg.subject).removeprefix(prefix).rsplit(".", 2)
            self._queue.put_nowait(Token(branch_id=branch, step_id=step, attempt=int(attempt), text=chunk.content,
                                         tool_calls=tuple((t.name, t.arguments) for t in chunk.tool_calls),
                                         done=chunk.done, error=chunk.error or "",
                                         progress=None if chunk.progress is None else (
                                             chunk.progress.progress, chunk.progress.total, chunk.progress.message)))

    async def __aenter__(self) -> TokenStream:
        if self._sub is None and not self._closed:
            h = self._handle
            self._sub = await h.client._nc.subscribe(h.client._cfg.names.stream_run(h.run_id), cb=self._on_msg)
            self._finished = asyncio.create_task(h.wait(FINISHED, timeout_s=None))
            self._finished.add_done_callback(lambda _: self._queue.put_nowait(None))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Unsubscribe (iteration then ends)."""
        self._closed = True
        self._queue.put_nowait(None)
        if self._finished is not None:
            self._finished.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    def __aiter__(self) -> TokenStream:
        return self

    async def __anext__(self) -> Token:
        await self.__aenter__()
        token = None if self._closed and self._queue.empty() else await self._queue.get()
        if token is None:
            await self.close()
            raise StopAsyncIteration
        return token


def _answer_text(body: bytes, agent: bool) -> str:
    """An output body as text; an agent's (its final turn's response message, JSON) as the message's content."""
    text = body.decode(errors="replace")
    if agent:
        with contextlib.suppress(msgspec.DecodeError):
            message = msgspec.json.decode(body)
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                return content
    return text


__all__ = ["Client", "ReelError", "RunHandle", "Startable"]
