"""The ``reel`` command line (``[project.scripts] reel = "services.cli:main"``); see :mod:`services.cli.app`."""

from services.cli.app import app, main

__all__ = ["app", "main"]
