"""What every ``reel`` command shares: the consoles, the common options, one-line errors and exit codes.

Exit codes of ``reel run`` / ``reel replay`` (and ``reel verdicts -f``): 0 passed,
succeeded or unlabelled (no outcome verifier: :mod:`shared.core.outcomes`), 3 failed or
error, 4 cancelled, 5 timed out, 6 awaiting input (``reel run``, and ``reel approve``,
``reject``, ``answer`` when the run waits again); 1 connection or input error (an
unknown run, an unreadable file; ``reel replay``: any unreadable trajectory), 2 usage
error (unknown option, missing or conflicting arguments: the click/typer convention),
130 Ctrl-C.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

from shared.core.errors import ReelError
from shared.nats.embedded import NatsServerNotFound, StoreInUse

EXIT = {"passed": 0, "succeeded": 0, "unlabelled": 0, "failed": 3, "error": 3, "cancelled": 4, "timeout": 5,
        "awaiting_input": 6}
"""Exit code per run outcome (and ``cancelled`` / ``timeout`` / ``awaiting_input``)."""

console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 150)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)

NatsUrl = typer.Option(None, "--nats-url", envvar="NATS_URL", help="NATS server URL (default: embedded server)")
Namespace = typer.Option("reel", "--namespace", envvar="REEL_NAMESPACE", help="subject/stream namespace")
JsonOut = typer.Option(False, "--json", help="print the service's reply as one JSON line (raw) instead of a sentence")


def reel_home() -> Path:
    """Where Reel keeps its local state (``$REEL_HOME``, default ``.reel``)."""
    return Path(os.environ.get("REEL_HOME", ".reel"))


class CliError(Exception):
    """One line for the user, and an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def usage_error(message: str) -> NoReturn:
    """One line on stderr and exit 2 (a usage error, as click reports its own).

    Raises:
        typer.Exit: always, code 2.
    """
    err_console.print(f"[red]error:[/] {message}")
    raise typer.Exit(2)


def run_async(coro: Awaitable[int | None]) -> None:
    """Run a command body; map errors to one line on stderr and an exit code.

    Raises:
        typer.Exit: always, with the body's code (0 for ``None``), the :class:`CliError`'s
            code, 1 for a :class:`ReelError` or a missing/locked embedded server, 130 on Ctrl-C.
    """
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
        if not _INTERRUPT_SAID:
            err_console.print("interrupted")
        raise typer.Exit(130) from None
    raise typer.Exit(code or 0)


_INTERRUPT_SAID = False


def said_interrupted() -> None:
    """A command printed its own line for Ctrl-C (``reel run``: what happens to the run): :func:`run_async`
    prints no second one."""
    global _INTERRUPT_SAID
    _INTERRUPT_SAID = True
