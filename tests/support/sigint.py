"""SIGINT in a child as a terminal's foreground job has it.

A process started in the background by a non-interactive shell (``cmd &``, ``nohup``: how a CI job or a script
may start the test run) inherits SIGINT *ignored*, every child after it too, and Python then keeps ignoring it —
rightly: ``reel run`` started that way is not stopped by a Ctrl-C it never gets. A test that sends SIGINT to a
child as a user's Ctrl-C passes :func:`as_at_a_terminal` as its ``preexec_fn``.
"""

from __future__ import annotations

import signal


def as_at_a_terminal() -> None:
    """In the forked child, before exec: SIGINT's default disposition (Python then raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
