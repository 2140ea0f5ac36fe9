"""What every ``reel`` command shares: the consoles, the common options, one-line errors and exit codes.

Exit codes of ``reel run`` / ``reel replay`` (and ``reel verdicts -f``): 0 passed,
succeeded or unlabelled (no outcome verifier: :mod:`reel.shared.core.verify.verification`), 3 failed or
error, 4 cancelled, 5 timed out, 6 awaiting input (``reel run``, and ``reel approve``,
``reject``, ``answer`` when the run waits again); 1 connection or input error (an
unknown run, an unreadable file; ``reel replay``: any unreadable trajectory), 2 usage
error (unknown option, missing or conflicting arguments: the click/typer convention),
130 Ctrl-C. An error is one line ``error: …`` on stderr; a command given ``--json`` also
prints it as one JSON object on stdout (:func:`json_error`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, NoReturn

import nats.errors
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from reel.services.cli import interrupt
from reel.shared.core.errors import ReelError
from reel.shared.nats.embedded import NatsServerNotFound, PortInUse, StoreInUse

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
    """One line for the user, and an exit code; ``kind`` names the error (``run_not_found``, ``timeout``…) in
    the line (``error: KIND: message``) and as the ``--json`` error's ``code``."""

    def __init__(self, message: str, code: int = 1, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind

    @property
    def error_code(self) -> str:
        """``kind``, else by exit code: ``usage`` (2), ``timeout`` (5), ``error``."""
        return self.kind or {2: "usage", 5: "timeout"}.get(self.code, "error")


def json_error(code: str, reason: str, exit_code: int) -> None:
    """The ``--json`` form of an error, one object on stdout:
    ``{"ok": false, "code": "run_not_found", "reason": "…", "exit": 1}`` (``exit``: the process's exit code)."""
    sys.stdout.write(json.dumps({"ok": False, "code": code, "reason": reason, "exit": exit_code}) + "\n")
    sys.stdout.flush()


def fail(code: str, reason: str, exit_code: int, *, json_out: bool = False, line: str | None = None) -> NoReturn:
    """Report an error — ``error: LINE`` on stderr (``line`` default ``reason``), and with ``json_out`` also
    :func:`json_error` on stdout — and exit.

    Raises:
        typer.Exit: always, ``exit_code``.
    """
    err_console.print(f"[red]error:[/] {escape(line if line is not None else reason)}", highlight=False)
    if json_out:
        json_error(code, reason, exit_code)
    raise typer.Exit(exit_code)


def usage_error(message: str, *, json_out: bool = False) -> NoReturn:
    """One line on stderr and exit 2 (a usage error, as click reports its own); with ``json_out`` also the JSON
    error (code ``usage``).

    Raises:
        typer.Exit: always, code 2.
    """
    fail("usage", message, 2, json_out=json_out)


_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
"""click's ``UsageError`` as typer uses it (recent typers vendor click: no public name; ``BadParameter`` derives
from it)."""


class ReelGroup(TyperGroup):
    """The ``reel`` group: a click usage error (unknown option, missing argument) of a command given ``--json`` is
    also printed as :func:`json_error` (code ``usage``, exit 2) on stdout before click reports it on stderr."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _untyped_flags(self)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["reel.args"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _UsageError as exc:
            if "--json" in ctx.meta.get("reel.args", ()):
                json_error("usage", exc.format_message(), exc.exit_code)  # type: ignore[attr-defined]
            raise


def _untyped_flags(group: Any) -> None:
    """A flag's help row shows no type (typer prints ``<bool>`` beside ``--quiet`` and ``--help``, as if they took
    a value): every flag of ``group``'s commands, recursively, and each command's ``--help``, gets an empty metavar."""
    for cmd in (group, *group.commands.values()):
        for param in cmd.params:
            _untyped(param)
        _untyped_help(cmd)
        if cmd is not group and isinstance(getattr(cmd, "commands", None), dict):  # a typer group
            _untyped_flags(cmd)


def _untyped(param: Any) -> None:
    if param is not None and getattr(param, "is_flag", False) and param.metavar is None:
        param.metavar = ""


def _untyped_help(cmd: Any) -> None:
    make = cmd.get_help_option

    def get_help_option(ctx: Any) -> Any:
        opt = make(ctx)
        _untyped(opt)
        return opt

    setattr(cmd, "get_help_option", get_help_option)  # noqa: B010 (an instance's own method, not the class's)


def run_async(coro: Coroutine[Any, Any, int | None], *, json_out: bool = False) -> None:
    """Run a command body; map errors to one line on stderr and an exit code (``json_out``: the command was given
    ``--json``: each error also as :func:`json_error` on stdout).

    Ctrl-C cancels the body, and the cancellation sticks (services/cli/interrupt.py).

    Raises:
        typer.Exit: always, with the body's code (0 for ``None``), the :class:`CliError`'s
            code, 1 for a :class:`ReelError`, a NATS error or a missing/locked embedded server, 130 on Ctrl-C.
    """
    try:
        code = interrupt.run(coro)
    except CliError as exc:
        fail(exc.error_code, str(exc), exc.code, json_out=json_out, line=f"{exc.kind}: {exc}" if exc.kind else None)
    except ReelError as exc:
        fail(exc.code, exc.message, 1, json_out=json_out, line=f"{exc.code}: {exc.message}")
    except NatsServerNotFound as exc:
        fail("nats_server_not_found", str(exc), 1, json_out=json_out)
    except StoreInUse as exc:
        fail("store_in_use", f"{exc}; run `reel up` to share one server between commands, or set REEL_HOME to use "
             "another store", 1, json_out=json_out)
    except PortInUse as exc:
        fail("port_in_use", f"{exc}: use that server with --nats-url nats://{exc.address}, or pass --port N", 1,
             json_out=json_out)
    except nats.errors.Error as exc:  # one outside a session (services/cli/embed.session maps its own, with the URL)
        fail("nats_error", f"NATS: {type(exc).__name__}: {str(exc).strip() or type(exc).__name__}", 1,
             json_out=json_out)
    except KeyboardInterrupt:
        if not interrupt.was_said():
            err_console.print("interrupted")
        if json_out:
            json_error("interrupted", "interrupted (Ctrl-C)", 130)
        raise typer.Exit(130) from None
    raise typer.Exit(code or 0)

