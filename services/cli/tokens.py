"""Streamed tokens in ``reel run`` and ``reel show --follow``: each attempt's fragments printed as they arrive.

A core-NATS subscription on ``<ns>.stream.<run_id>.>`` (docs/subjects.md, "Streamed tokens"):
an attempt's text goes on one line of its own, ``  ┆ solve:t1#1  Let me look…``; a tool call's
fragments as ``[lookup] {"key": …``; the attempt's end closes the line (``✗ <error>`` when the
stream broke or the call failed). A progress line printed meanwhile (a commit) ends the token
line first, and the next fragment starts a new one with its attempt named again. Tokens are
not stored: what a run answered is in its output blobs (``reel show``).
"""

from __future__ import annotations

from nats.aio.msg import Msg
from rich.console import Console
from rich.text import Text

from reel.shared.core.wire.livemessages import decode_chunk


class TokenPrinter:
    """Prints the fragments of one run's streams on ``console`` (see module doc).

    Args:
        prefix: the run's stream subject prefix, ``<ns>.stream.<run_id>.`` (the rest: branch.step.attempt).
    """

    def __init__(self, console: Console, prefix: str) -> None:
        self.console, self.prefix = console, prefix
        self.current: str | None = None

    def break_line(self) -> None:
        """End the token line being printed, if any (before a progress line)."""
        if self.current is not None:
            self.console.print()
            self.current = None

    async def on_msg(self, msg: Msg) -> None:
        """One stream message (the subscription's callback); an unreadable one is skipped."""
        try:
            chunk = decode_chunk(msg.data)
            _branch, step, attempt = msg.subject.removeprefix(self.prefix).rsplit(".", 2)
        except Exception:  # not a stream message of this version: the log has the response anyway
            return
        key = f"{step}#{attempt}"
        if key != self.current:
            self.break_line()
            self.console.print(Text(f"  ┆ {key}  ", style="dim"), end="")
            self.current = key
        out = Text(chunk.content)
        for t in chunk.tool_calls:
            if t.name:
                out.append(f" [{t.name}] ", style="cyan")
            out.append(t.arguments)
        if out:
            self.console.print(out, end="")
        if chunk.done:
            if chunk.error:
                self.console.print(Text(f"  ✗ {chunk.error}", style="red"), end="")
            self.break_line()
