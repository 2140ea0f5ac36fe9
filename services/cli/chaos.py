"""``reel chaos WORKFLOW``: run a workflow with its executor killed at every intent/outcome boundary in turn.

The pure parts (the crash points, end states, the report) are :mod:`reel.shared.core.run.crashpoints`; this module
starts the processes and prints the table (docs/chaos.md):

1. a NATS server — ``--nats-url``, else an embedded one on a temporary store — and a namespace of
   its own (``chaos-<hex>``, unless ``--namespace``), so no other executor takes its runs; the
   verifier and recovery run in this process;
2. two unkilled reference runs, each driven by a fresh ``python -m reel.services.executor`` process;
   the crash points are read off the first one's log (:func:`reel.shared.core.run.crashpoints.crash_points`);
3. per crash point (``--runs`` times each): an executor process with ``REEL_EXECUTOR_CRASH_AT`` set
   to it starts a run and sends itself SIGKILL there; a fresh executor takes the run over (its
   start command comes back after the ack wait; recovery resolves what the dead one left) and
   drives it to rest;
4. the side effects each run started, from the ledger every executor appends to
   (``REEL_SIDE_EFFECT_LEDGER``, set only for these processes: shared/proc/ledger.py).

Executors are started *warm*: each process imports the executor, then waits on its stdin for its
crash point (``-``: none) before it connects, so the few seconds of imports overlap the previous run.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.table import Table

from reel.services.cli.console import CliError, NatsUrl, console, err_console, run_async
from reel.services.cli.embed import in_process_services
from reel.shared.application.toolimports import check_tool_imports, tool_search_path
from reel.shared.core.run import crashpoints as core
from reel.shared.core.run.ids import run_id_for_key
from reel.shared.core.run.views import build_episode_view
from reel.shared.core.wire.commands import Reply
from reel.shared.core.wire.subjects import Names
from reel.shared.core.workflow.spec import WorkflowSpec, load_workflow
from reel.shared.nats.blobstore import JetStreamBlobStore
from reel.shared.nats.client import ReelClient
from reel.shared.nats.embedded import url_or_embedded
from reel.shared.nats.infra import Infra, connect, ensure_infra
from reel.shared.proc.ledger import LEDGER_ENV
from reel.shared.proc.ledger import read as read_ledger
from reel.shared.runtime.config import Config

LEASE_TTL_S = 2
"""The executors' default lease TTL (s, ``--lease-ttl``): a killed one is known gone after about two of them. At
1 s a loaded machine's heartbeats came late: an executor then lets its runs go and kills its tools as if killed,
which is not a crash point's doing (reported beside the table)."""
START_TRIES = 5
ACK_WAIT_S = 2.0
"""The command ack wait (s): a killed executor's start command comes back to the next one this soon."""
REST = ("completed", "cancelled", "awaiting_input")
MAX_REFERENCES = 6
"""While killed runs' end states differ, unkilled runs are added up to this many: a field that differs between
them (a timing printed in an output) is not compared, one they all agree on is a difference."""
_WARM = (
    "import os, runpy, sys\n"
    "import reel.services.executor.app  # the imports are most of a start: done before the crash point is known\n"
    "point = sys.stdin.readline().strip()\n"
    "if not point:\n"
    "    sys.exit(0)\n"
    f"if point != '-':\n    os.environ[{core.CRASH_ENV!r}] = point\n"
    "runpy.run_module('reel.services.executor', run_name='__main__', alter_sys=True)\n"
)


@dataclass
class Executor:
    """One warm executor process and its log file."""

    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def alive(self) -> bool:
        """Whether it still runs."""
        return self.process.returncode is None

    async def stop(self) -> None:
        """SIGKILL it (its run is at rest: nothing is in flight) and reap it."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    def lost_lease(self) -> bool:
        """Whether its log says it lost its lease (``lease.lost``: it was not renewed in time)."""
        return self.log_path.exists() and '"lease.lost"' in self.log_path.read_text(errors="replace")

    def tail(self, chars: int = 2000) -> str:
        """The end of its log."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


@dataclass
class Executors:
    """Starts executor processes against ``env`` (logs under ``workdir``), one kept warm ahead of need."""

    env: dict[str, str]
    workdir: Path
    spare: asyncio.Task[Executor] | None = None
    started: list[Executor] = field(default_factory=list)

    async def _spawn(self) -> Executor:
        log_path = self.workdir / f"executor-{len(self.started)}.log"
        with log_path.open("wb") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _WARM, env=self.env, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
        ex = Executor(process, log_path)
        self.started.append(ex)
        return ex

    async def take(self, crash_at: str = "") -> Executor:
        """A started executor, told its crash point (``""``: none); the next one is started warm meanwhile."""
        ex = await (self.spare if self.spare is not None else asyncio.ensure_future(self._spawn()))
        self.spare = asyncio.ensure_future(self._spawn())
        assert ex.process.stdin is not None
        ex.process.stdin.write(f"{crash_at or '-'}\n".encode())
        await ex.process.stdin.drain()
        return ex

    async def close(self) -> None:
        """Stop every executor started (the spare too)."""
        if self.spare is not None:
            with contextlib.suppress(Exception):
                await self.spare  # it is in ``started`` once spawned
        for ex in self.started:
            if ex.process.stdin is not None:
                ex.process.stdin.close()
            await ex.stop()


def keyed_tools(spec: WorkflowSpec, source_dir: str | None = None) -> frozenset[tuple[str, str]]:
    """``(agent step, tool)`` of the Python tools whose signature takes ``idempotency_key`` (looked up as the
    executor does for a run from a file in ``source_dir``).

    Raises:
        WorkflowInvalid: a ``python:`` tool does not resolve.
    """
    out = set()
    for key, fn in check_tool_imports(spec, search=tool_search_path(source_dir)).items():
        with contextlib.suppress(TypeError, ValueError):
            if "idempotency_key" in inspect.signature(fn).parameters:
                out.add(key)
    return frozenset(out)


@dataclass
class Chaos:
    """One ``reel chaos`` session: the client, the executors, the workflow, the ledger."""

    client: ReelClient
    executors: Executors
    spec: WorkflowSpec
    tools: tuple[core.Tool, ...]
    timeout_s: float
    ledger: Path
    source_dir: str | None = None  # the workflow file's folder (where its python tools are looked up first)
    session: str = field(default_factory=lambda: f"chaos-{secrets.token_hex(6)}")
    started: int = 0

    async def run(self, point: str) -> core.ChaosRun:
        """One run with its first executor killed at ``point`` (``""``: not killed), driven to rest.

        The start is keyed (its run id known before any reply), and its reply is awaited beside the executor's
        death: a crash before the reply leaves it to the executor that takes over.

        Raises:
            CliError: the start was refused, or the executor ended otherwise than by a crash point's SIGKILL.
        """
        self.started += 1
        key = f"{self.session}-{self.started}"
        run_id = run_id_for_key(key)
        first = await self.executors.take(point)
        starting = asyncio.ensure_future(self.client.start(self.spec, idempotency_key=key, timeout_s=self.timeout_s,
                                                           source_dir=self.source_dir))
        died = asyncio.ensure_future(first.process.wait())
        resting = asyncio.ensure_future(self._started_then_rest(starting, key))
        await asyncio.wait([resting, died], return_when=asyncio.FIRST_COMPLETED)
        reached = died.done() and not resting.done()
        if died.done() and first.process.returncode != -signal.SIGKILL:
            resting.cancel()
            raise CliError(f"the executor exited {first.process.returncode}, not by a crash point: {first.tail()}")
        takeover = await self.executors.take() if reached else None
        finished = await resting
        for ex in (first, takeover):
            if ex is not None:
                await ex.stop()
        view = build_episode_view(await self.client.log.load(run_id))
        lost = any(ex.lost_lease() for ex in (first, takeover) if ex is not None)
        return core.ChaosRun(point=point, run_id=run_id, reached=reached or not point, finished=finished,
                             state=core.end_state(view), lease_lost=lost)

    async def _started_then_rest(self, starting: asyncio.Future[Reply], key: str) -> bool:
        """Once the start (idempotency key ``key``) is answered ok — a retryable refusal is sent again, up to
        :data:`START_TRIES` in all — wait until its run is at rest (:data:`REST`); False on timeout.

        Raises:
            CliError: the start was refused.
        """
        run_id = run_id_for_key(key)
        reply = await starting
        for _ in range(START_TRIES - 1):  # e.g. lease_lost: the same keyed start is answered by the next incarnation
            if reply.ok or reply.error is None or not reply.error.retryable:
                break
            reply = await self.client.start(self.spec, idempotency_key=key, timeout_s=self.timeout_s,
                                            source_dir=self.source_dir)
        if not reply.ok or reply.run_id != run_id:
            raise CliError(f"start refused: {reply.error.code if reply.error else '?'}: "
                           f"{reply.error.message if reply.error else ''}")
        try:
            await self.client.wait_for(run_id, REST, timeout_s=self.timeout_s)
        except TimeoutError:
            return False
        return True

    async def points(self, reference: core.ChaosRun) -> tuple[str, ...]:
        """The crash points of the workflow, read off the reference run's log."""
        view = build_episode_view(await self.client.log.load(reference.run_id))
        commits = [c.events for _, c in await self.client.log.read(reference.run_id)]
        return core.crash_points(commits, core.side_effect_steps(view, self.tools))


async def run_chaos(chaos: Chaos, *, runs: int, only: str | None, references: int = 2) -> core.Report:
    """``references`` unkilled runs, then every crash point ``runs`` times (progress on stderr), then more unkilled
    runs while end states differ (up to :data:`MAX_REFERENCES`); the report."""
    t0 = time.monotonic()
    refs = [await chaos.run("") for _ in range(references)]
    if not all(r.finished for r in refs):
        raise CliError(f"the workflow did not come to rest within {chaos.timeout_s:g} s without a crash "
                       f"(status of the reference run: {refs[0].state.get('status')})")
    points = [p for p in await chaos.points(refs[0]) if only is None or only in p]
    todo = [p for p in points for _ in range(runs)]
    err_console.print(f"[dim]reference runs: {references} in {time.monotonic() - t0:.1f} s; "
                      f"{len(points)} crash points × {runs} run(s)[/]")
    killed = []
    for i, point in enumerate(todo, 1):
        started = time.monotonic()
        done = await chaos.run(point)
        killed.append(done)
        what = "killed" if done.reached else "not reached"
        rested = "" if done.finished else f", NOT at rest after {chaos.timeout_s:g} s"
        err_console.print(f"point {i} of {len(todo)}: {point}: {what}{rested} ({time.monotonic() - started:.1f} s)")
    rep = core.report(chaos.tools, refs, killed, read_ledger(chaos.ledger))
    while rep.differing and len(refs) < MAX_REFERENCES:  # a varying output, or a real difference?
        refs.append(await chaos.run(""))
        err_console.print(f"[dim]reference run {len(refs)} (unkilled): some killed run's end state differs, so "
                          "one more reference checks whether that field differs between unkilled runs too[/]")
        rep = core.report(chaos.tools, refs, killed, read_ledger(chaos.ledger))
    return rep


def _remedy(kind: str) -> str:
    """What a user can do about a tool that ran twice (docs/chaos.md, "When a tool ran twice")."""
    if kind == "python":
        return ("give the function an `idempotency_key` parameter and dedupe on it (the same key for every attempt "
                "of a call), or declare `retry_safe: true` if running it twice is harmless")
    return ("make the command dedupe on $REEL_IDEMPOTENCY_KEY (the same for every attempt of a call) and declare "
            "`retry_safe: true`, or declare it only if running it twice is harmless")


def print_report(rep: core.Report) -> None:
    """The per-tool table, the differing end states, and the final line."""
    table = Table(title=f"side effects over {rep.killed} killed runs", title_justify="left")
    for col in ("tool", "side-effect runs", "expected", "ran twice at", "retry-safe / keyed", "verdict"):
        table.add_column(col, overflow="fold")
    for r in rep.rows:
        style = "green" if not r.repeated_at else "yellow" if r.ok else "bold red"
        where = ", ".join(r.repeated_at) or "—"
        table.add_row(f"{r.tool.label} ({r.tool.kind})", str(r.runs), str(r.expected), where, r.tool.safety,
                      f"[{style}]{r.verdict}[/]")
    console.print(table)
    for point, diffs in rep.differing.items():
        console.print(f"[red]end state differs[/] after a kill at {point}: " + "; ".join(diffs[:4])
                      + (f" (+{len(diffs) - 4} more)" if len(diffs) > 4 else ""))
    if rep.masked:
        console.print(f"[dim]not compared (they differ between unkilled runs): {', '.join(sorted(rep.masked))}[/]")
    if rep.lease_lost:
        where = ", ".join(p or "a reference run" for p in rep.lease_lost)
        console.print(f"[yellow]an executor lost its lease without a kill (its heartbeats came late: a loaded "
                      f"machine?) in {len(rep.lease_lost)} run(s)[/]: {where} — a repeat there may be that loss's, "
                      "not the crash point's")
    if rep.unreached:
        console.print(f"[yellow]crash points never reached[/]: {', '.join(rep.unreached)}")
    twice = [r.tool.label for r in rep.rows if not r.ok]
    for r in rep.rows:
        if not r.ok:
            console.print(f"[yellow]{r.tool.label}[/]: {_remedy(r.tool.kind)}")
    same = rep.killed - len(rep.differing) - len(rep.unfinished)
    line = (f"{rep.killed} killed runs; {same} ended as the unkilled run did; "
            + (f"NOT exactly-once: {', '.join(twice)}" if twice else "no tool that is not retry-safe ran twice")
            + (f"; {len(rep.unfinished)} did not come to rest" if rep.unfinished else ""))
    console.print(f"[{'green' if rep.ok else 'bold red'}]{'ok' if rep.ok else 'FAILED'}[/]: {line}")


async def _drop_namespace(infra: Infra, names: Names) -> None:
    """Delete the namespace's streams and buckets (a chaos session's own, on a server it did not start)."""
    js = infra.js
    for stream in (names.events_stream, names.commands_stream, names.verdicts_stream):
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
    for bucket in (names.lease_bucket, names.outcome_bucket, names.snapshot_bucket):
        with contextlib.suppress(Exception):
            await js.delete_key_value(bucket)
    with contextlib.suppress(Exception):
        await js.delete_object_store(names.blob_bucket)


def executor_env(cfg: Config, ledger_path: Path) -> dict[str, str]:
    """The chaos executors' environment: this one's, the session's server, namespace and short timings, the
    ledger, crash points as real SIGKILLs (no crash point of the caller's environment is inherited)."""
    env = {k: v for k, v in os.environ.items() if k not in (core.CRASH_ENV, LEDGER_ENV)}
    env.update({"NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace,
                "REEL_LEASE_TTL_S": str(cfg.lease_ttl_s), "REEL_COMMAND_ACK_WAIT_S": str(ACK_WAIT_S),
                LEDGER_ENV: str(ledger_path), core.CRASH_SIGNAL_ENV: "KILL", "REEL_LOG_FORMAT": "json",
                "REEL_LOG_LEVEL": "INFO"})
    return env


@contextlib.asynccontextmanager
async def chaos_session(spec: WorkflowSpec, nats_url: str | None, namespace: str | None, timeout_s: float,
                        workdir: Path, *, lease_ttl_s: int = LEASE_TTL_S, source_dir: str | None = None
                        ) -> AsyncIterator[Chaos]:
    """A server, a namespace, the verifier and recovery in this process, and the executors, for the block
    (``source_dir``: the workflow file's folder, sent with each start)."""
    tools = core.tools_of(spec, keyed_tools(spec, source_dir))
    async with contextlib.AsyncExitStack() as stack:
        url, embedded = await stack.enter_async_context(url_or_embedded(nats_url, workdir / "js"))
        names = Names(namespace or f"chaos-{secrets.token_hex(4)}")
        cfg = Config.from_env(nats_url=url, names=names, lease_ttl_s=lease_ttl_s, command_ack_wait_s=ACK_WAIT_S)
        nc = await connect(cfg, name="reel-chaos")
        stack.push_async_callback(nc.close)
        infra = await ensure_infra(nc, cfg)
        if not embedded and namespace is None:
            stack.push_async_callback(_drop_namespace, infra, names)
        await stack.enter_async_context(in_process_services(infra, cfg, ("verifier", "recovery")))
        ledger_path = workdir / "side-effects.jsonl"
        executors = Executors(executor_env(cfg, ledger_path), workdir)
        stack.push_async_callback(executors.close)
        blobs = JetStreamBlobStore(nc, infra.blobs, names.blob_bucket)
        err_console.print(f"[dim]chaos on {'an embedded server' if embedded else url}, namespace {names.namespace}, "
                          f"{len(tools)} tool(s) with side effects[/]")
        yield Chaos(ReelClient(nc, cfg, blobs), executors, spec, tools, timeout_s, ledger_path, source_dir)


def chaos(
    file: Path = typer.Argument(..., help="workflow spec (YAML or JSON, see docs/workflow.md)"),
    runs: int = typer.Option(1, "--runs", min=1, help="killed runs per crash point"),
    only: str | None = typer.Option(None, "--only", help="only the crash points whose name contains this text"),
    timeout: float = typer.Option(120.0, "--timeout", min=0.1, help="seconds each run may take to come to rest"),
    references: int = typer.Option(2, "--references", min=2, max=MAX_REFERENCES, help="unkilled runs first (more "
                                   "follow while end states differ): a field that differs between them (a timing "
                                   "in an output) is not compared"),
    lease_ttl: int = typer.Option(LEASE_TTL_S, "--lease-ttl", min=1, help="the executors' lease TTL (s): a killed "
                                  "one is taken over after about two; raise it on a loaded machine"),
    workdir: Path | None = typer.Option(None, "--workdir", help="keep the executors' logs and the side-effect "
                                        "ledger in this directory (default: a temporary one, removed)"),
    nats_url: str | None = NatsUrl,
    namespace: str | None = typer.Option(None, "--namespace", help="namespace of the chaos runs (default: a fresh "
                                         "chaos-<hex>, deleted afterwards on a --nats-url server; never one that "
                                         "live executors serve: they would take the runs)"),
) -> None:
    """Run the workflow FILE with a real executor process SIGKILLed at every intent/outcome boundary in turn
    (recovery on), each killed run taken over by a fresh executor until it is at rest, plus unkilled reference
    runs; print how often each tool's side effect ran, which calls ran twice without being retry-safe, and
    whether every run ended in the unkilled run's state. Exit 1 if a tool that is neither retry-safe nor keyed
    ran twice, or an end state differs (docs/chaos.md)."""
    folder = str(file.resolve().parent)  # where the executors look for the workflow's python tools first

    async def body() -> int:
        spec = load_workflow(file, env=os.environ)
        with contextlib.ExitStack() as stack:
            where = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="reel-chaos-")))
            where.mkdir(parents=True, exist_ok=True)
            async with chaos_session(spec, nats_url, namespace, timeout, where, lease_ttl_s=lease_ttl,
                                     source_dir=folder) as ch:
                rep = await run_chaos(ch, runs=runs, only=only, references=references)
        print_report(rep)
        return 0 if rep.ok else 1

    run_async(body())
