"""Ctrl-C for a command body: the first press cancels it and the cancellation sticks; a second press stops it
at once.

``asyncio.run`` cancels the main task once on SIGINT, and Python 3.11's ``asyncio.wait_for`` (which nats-py's
requests use) swallows a cancellation that arrives in the same loop turn as the awaited reply (fixed in 3.12):
the command would then go on as if no key had been pressed (``reel run`` following its run to the end). A
process that inherited SIGINT ignored (``nohup``, ``cmd &`` in a script) keeps ignoring it, as ``asyncio.run``
does. :func:`run` cancels the body
again every :data:`RECANCEL_S` seconds until the body shows it has seen the cancellation (:func:`seen`: a
command's ``except CancelledError``, or :func:`reel.services.cli.embed.session` as it unwinds) — from then on its
cleanup (``reel run``'s own executor recording its attempts ``interrupted``) runs undisturbed. A second Ctrl-C
raises :class:`KeyboardInterrupt` at once, as ``asyncio.run`` does.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

RECANCEL_S = 0.25
"""Seconds between cancellations of a body that has not yet seen the first one."""


class _State:
    """What this process's command saw of Ctrl-C: ``presses``; ``seen``: the body saw the cancellation; ``said``:
    it printed its own line for it (:func:`reel.services.cli.console.run_async` then prints no second one)."""

    def __init__(self) -> None:
        self.presses = 0
        self.seen = False
        self.said = False


_STATE = _State()


def seen() -> None:
    """The body saw the cancellation (called where it catches it, before its cleanup): stop cancelling it."""
    _STATE.seen = True


def said() -> None:
    """The body printed its own line for Ctrl-C (and so saw the cancellation)."""
    _STATE.said = _STATE.seen = True


def was_said() -> bool:
    """Whether the body printed its own line for Ctrl-C."""
    return _STATE.said


def run(body: Coroutine[Any, Any, T]) -> T:
    """Run ``body`` to its end on a new event loop (as ``asyncio.run``), with Ctrl-C as the module says.

    Raises:
        KeyboardInterrupt: Ctrl-C was pressed (also when the body ended normally after it).
        whatever ``body`` raises.
    """
    global _STATE
    _STATE = _State()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # SIGINT ignored, or not ours to take
        return asyncio.run(body)
    with asyncio.Runner() as runner:
        loop = runner.get_loop()
        task = loop.create_task(body)

        def cancel_until_seen() -> None:
            if task.done() or _STATE.seen:
                return
            task.cancel()
            loop.call_later(RECANCEL_S, cancel_until_seen)

        def on_sigint() -> None:
            _STATE.presses += 1
            if _STATE.presses > 1:
                raise KeyboardInterrupt
            cancel_until_seen()

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            result = loop.run_until_complete(task)
        except asyncio.CancelledError:
            if _STATE.presses:
                raise KeyboardInterrupt from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        if _STATE.presses:
            raise KeyboardInterrupt
        return result
