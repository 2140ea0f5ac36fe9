"""The ``reel`` command line (``[project.scripts] reel = "reel.services.cli:main"``); see :mod:`reel.services.cli.app`.

Kept light: :func:`main` imports the app itself, so a Ctrl-C during the first second
(importing typer, rich, nats-py, the core) ends in one line, ``interrupted``, and exit
code 130 — not a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point: import the app, then run it (Ctrl-C while importing: exit 130)."""
    try:
        from reel.services.cli.app import main as app_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    app_main()


def __getattr__(name: str) -> object:
    """``reel.services.cli.app`` (the typer app) on first use, as before the entry point became lazy."""
    if name == "app":
        from reel.services.cli.app import app

        return app
    raise AttributeError(name)


__all__ = ["app", "main"]
