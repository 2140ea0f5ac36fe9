"""``reel crucible …``: run, resume and show autoresearch sessions (docs/crucible.md).

Mounted by the ``reel`` CLI as ``reel crucible``; also runnable alone as
``python -m reel.services.crucible.cli``.

NATS: ``--nats-url`` / ``$NATS_URL`` if given; otherwise an embedded nats-server
is started for the duration of the command with a persistent JetStream store
(``--store-dir``, default ``$REEL_HOME/crucible-js``; ``$REEL_HOME`` defaults to
``.reel`` under the current directory), so a ``resume`` after a kill finds the session
log. Process groups are recorded in ``$REEL_TOOL_DIR`` (default ``$REEL_HOME/tools``)
so that ``resume`` can kill what a killed driver left running.

Exit codes of ``run``/``resume``: 0 Solved, 3 Finished, 4 Budget, 5 Stopped,
6 Escalated; 1 an error (one line on stderr), 2 a usage error.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import typer
from nats.errors import NoServersError
from rich.console import Console

from reel.services.cli.embed import in_process_services
from reel.services.crucible import report
from reel.services.crucible.session import (
    Backend,
    SessionResult,
    backend,
    load_config_file,
    resume_session,
    start_session,
)
from reel.shared.core.errors import ReelError
from reel.shared.core.wire.subjects import Names
from reel.shared.crucible.config import SessionConfig
from reel.shared.crucible.fold import SessionState
from reel.shared.crucible.integrity import SessionCorrupt
from reel.shared.nats.embedded import NatsServerNotFound, url_or_embedded
from reel.shared.proc.reaper import REGISTRY_ENV
from reel.shared.runtime.config import Config
from reel.shared.runtime.logging import setup_logging

app = typer.Typer(
    help="Crucible, the autoresearch loop: a proposer edits a git world, a frozen judge scores it, "
         "the loop keeps improvements and rolls back the rest; every step is logged on JetStream.",
    no_args_is_help=True, add_completion=False,
)
out = Console() if sys.stdout.isatty() else Console(width=160)  # piped: wide enough for the rows table
err = Console(stderr=True)
T = TypeVar("T")


def reel_home() -> Path:
    """Where Reel keeps local state: ``$REEL_HOME``, default ``.reel`` (the ``reel`` CLI's convention)."""
    return Path(os.environ.get("REEL_HOME", ".reel"))

NatsUrl = typer.Option(None, "--nats-url", envvar="NATS_URL",
                       help="NATS server(s); default: an embedded server on --store-dir.")
Namespace = typer.Option(None, "--namespace", envvar="REEL_NAMESPACE", help="Reel namespace (default reel).")
StoreDir = typer.Option(None, "--store-dir", help="JetStream store of the embedded server "
                                                   "(default $REEL_HOME/crucible-js).")
Quiet = typer.Option(False, "--quiet", "-q", help="Print only the session id.")


def _cfg(url: str, namespace: str | None) -> Config:
    return Config.from_env(nats_url=url, names=Names(namespace) if namespace else None)


LAB_SERVICES = ("executor", "verifier", "cancel")
"""What a ``lab`` judge's runs need (and the cancel of an abandoned batch's): run here when nothing serves the
namespace yet (as ``reel run`` does)."""


def has_lab(config: SessionConfig) -> bool:
    """True if a regime of ``config`` is judged by a ``lab`` (its runs need an executor and a verifier)."""
    return any(r.judge.lab is not None for r in config.regimes)


def _execute(url: str | None, namespace: str | None, store: Path | None, writer: str,
             body: Callable[[Backend, asyncio.Event], Awaitable[T]],
             runs: Callable[[Backend], Awaitable[bool]] | None = None) -> T:
    """Run ``body`` against NATS with SIGINT/SIGTERM setting the stop event; errors become one line + exit 1.

    ``runs``: asked first whether the session starts Reel runs (a ``lab`` judge); then the executor and the
    verifier run in this process unless some process already serves them on the server and namespace (on an
    embedded server, always).
    """
    os.environ.setdefault(REGISTRY_ENV, str((reel_home() / "tools").resolve()))  # resume reaps orphans
    store_dir = store if store is not None else reel_home() / "crucible-js"
    if not url:
        store_dir = store_dir.resolve()
        store_dir.mkdir(parents=True, exist_ok=True)

    async def main() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _stopper(stop))
        async with (url_or_embedded(url or None, store_dir) as (nats_url, _),
                    backend(_cfg(nats_url, namespace), writer=writer) as b):
            if runs is None or b.infra is None or not await runs(b):
                return await body(b, stop)
            async with in_process_services(b.infra, b.cfg, LAB_SERVICES, own_server=not url):
                return await body(b, stop)

    try:
        return asyncio.run(main())
    except ReelError as exc:
        _error(exc.message)
    except (NoServersError, OSError, NatsServerNotFound, RuntimeError) as exc:
        _error(f"cannot reach NATS: {exc or type(exc).__name__}")
    raise typer.Exit(1)


def _error(message: str) -> None:
    """One line on stderr (never wrapped)."""
    typer.echo("error: " + " ".join(message.split()), err=True)


def _stopper(stop: asyncio.Event) -> Callable[[], None]:
    def on_signal() -> None:
        if not stop.is_set():
            err.print("stop requested: finishing the current iteration…", highlight=False)
        stop.set()

    return on_signal


def _drive(url: str | None, namespace: str | None, store_dir: Path | None, quiet: bool,
           body: Callable[[Backend, asyncio.Event], Awaitable[SessionResult]],
           runs: Callable[[Backend], Awaitable[bool]]) -> NoReturn:
    """Drive a session with ``body``, print its rows and summary (unless ``quiet``) and its id; exit with its code."""
    result = _execute(url, namespace, store_dir, "crucible-cli", body, runs)
    if not quiet:
        out.print(report.rows_table(result.state))
        out.print(report.summary(result.state), highlight=False)
    out.print(f"session: {result.session_id}", highlight=False)
    raise typer.Exit(result.exit.exit_code)


@app.command()
def run(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Session config (YAML or JSON)."),
    session: str | None = typer.Option(None, "--session", help="Session id (default: a fresh cs-… id)."),
    nats_url: str | None = NatsUrl,
    namespace: str | None = Namespace,
    store_dir: Path | None = StoreDir,
    quiet: bool = Quiet,
) -> None:
    """Start a session from CONFIG and run it to its end (exit code = how it ended)."""
    setup_logging("crucible")
    try:
        spec = load_config_file(config)
    except ReelError as exc:
        _error(exc.message)
        raise typer.Exit(1) from exc

    async def body(b: Backend, stop: asyncio.Event) -> SessionResult:
        return await start_session(b, spec, stop=stop, session_id=session)

    async def runs(b: Backend) -> bool:
        return has_lab(spec)

    _drive(nats_url, namespace, store_dir, quiet, body, runs)


@app.command()
def resume(
    session: str = typer.Argument(..., help="Session id."),
    nats_url: str | None = NatsUrl,
    namespace: str | None = Namespace,
    store_dir: Path | None = StoreDir,
    quiet: bool = Quiet,
) -> None:
    """Continue SESSION from its log (a finished session just reports its exit again)."""
    setup_logging("crucible")

    async def body(b: Backend, stop: asyncio.Event) -> SessionResult:
        return await resume_session(b, session, stop=stop)

    async def runs(b: Backend) -> bool:
        try:
            state = await b.log.load(session)
        except ReelError:  # no such session, or a corrupt one: resume_session says so
            return False
        return has_lab(state.started.config) and not (state.ended is not None and state.ended.exit.terminal)

    _drive(nats_url, namespace, store_dir, quiet, body, runs)


@app.command()
def show(
    session: str = typer.Argument(..., help="Session id."),
    tsv: Path | None = typer.Option(None, "--tsv", help="Write the rows as TSV here."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the session (rows, run, outcome) as JSON."),
    png: Path | None = typer.Option(None, "--png", help="Draw score over iterations to this PNG."),
    nats_url: str | None = NatsUrl,
    namespace: str | None = Namespace,
    store_dir: Path | None = StoreDir,
) -> None:
    """Print SESSION's rows (iteration, verdict, readings, score, delta, kept sha) and export them."""
    setup_logging("crucible", level=os.environ.get("REEL_LOG_LEVEL", "WARNING"))

    async def body(b: Backend, stop: asyncio.Event) -> SessionState | SessionCorrupt:
        try:
            return await b.log.load(session)
        except SessionCorrupt as exc:
            return exc

    got = _execute(nats_url, namespace, store_dir, "crucible-show", body)
    if isinstance(got, SessionCorrupt):  # what is known up to the bad commit, then where it breaks
        if got.state is not None:
            out.print(report.rows_table(got.state))
        _error(got.message)
        raise typer.Exit(1)
    state = got
    out.print(report.rows_table(state))
    out.print(report.summary(state), highlight=False)
    if tsv:
        tsv.write_text(report.to_tsv(state.run.rows if state.run else ()))
    if json_path:
        json_path.write_bytes(report.to_json(state))
    if png:
        report.plot_png(state, png)


@app.command("ls")
def list_sessions(nats_url: str | None = NatsUrl, namespace: str | None = Namespace,
                  store_dir: Path | None = StoreDir) -> None:
    """List session ids with their exit."""
    setup_logging("crucible", level=os.environ.get("REEL_LOG_LEVEL", "WARNING"))

    async def body(b: Backend, stop: asyncio.Event) -> None:
        for sid in await b.log.sessions():
            try:
                state = await b.log.load(sid)
            except SessionCorrupt as exc:
                out.print(f"{sid}\t-\tcorrupt\tat LSN {exc.lsn}: {exc.reason}", highlight=False)
                continue
            ended = state.ended.exit.value if state.ended else "open"
            best = f"{state.run.segment.best_score:.6g}" if state.run else "-"
            out.print(f"{sid}\t{state.started.config.name}\t{ended}\tbest {best}", highlight=False)

    _execute(nats_url, namespace, store_dir, "crucible-show", body)


def main() -> None:
    """Entry point of ``python -m reel.services.crucible.cli``."""
    app()


if __name__ == "__main__":
    main()
