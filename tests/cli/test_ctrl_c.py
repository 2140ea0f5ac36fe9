"""Ctrl-C sticks: a command body whose first cancellation is swallowed (as Python 3.11's ``asyncio.wait_for``
swallows one that lands in the same loop turn as its reply) is cancelled again until it sees it; a body that saw
it finishes its cleanup undisturbed; a second Ctrl-C stops at once. Real processes, real SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys

from tests.integration.test_cli import REPO
from tests.support.sigint import as_at_a_terminal

PRELUDE = """
import asyncio
import sys
import typer
from reel.services.cli import interrupt
from reel.services.cli.console import run_async

def main(body):
    try:
        run_async(body)
    except typer.Exit as exc:  # as typer's own runner turns it into the exit code
        sys.exit(exc.exit_code)
"""

SWALLOWS = PRELUDE + """
async def body() -> int:
    print("ready", flush=True)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        print("swallowed", flush=True)  # and goes on, as if no key had been pressed
    await asyncio.sleep(60)
    return 0

main(body())
"""

CLEANS_UP = PRELUDE + """
async def body() -> int:
    print("ready", flush=True)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        interrupt.seen()
        print("cleaning", flush=True)
        await asyncio.sleep({cleanup_s})  # e.g. recording the attempts in flight interrupted
        print("cleaned", flush=True)
        raise
    return 0

main(body())
"""


async def _interrupted(script: str, *, presses: tuple[str, ...]) -> tuple[int, list[str], str]:
    """Run ``script``; send SIGINT once it printed ``ready`` and again after each line of ``presses[1:]``
    (``presses[0]`` is ``ready``): (exit code, its stdout lines, its stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=as_at_a_terminal)
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    for wanted in presses:
        while (line := (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()) != wanted:
            assert line, f"ended before printing {wanted!r}: {lines}"
            lines.append(line)
        lines.append(line)
        proc.send_signal(signal.SIGINT)
    out = (await asyncio.wait_for(proc.stdout.read(), 30)).decode()  # bounded: a Ctrl-C that was lost hangs here
    err = (await asyncio.wait_for(proc.stderr.read(), 30)).decode()
    return await proc.wait(), lines + out.split(), err


async def test_a_swallowed_ctrl_c_is_delivered_again() -> None:
    code, lines, err = await _interrupted(SWALLOWS, presses=("ready",))
    assert code == 130 and lines == ["ready", "swallowed"], (code, lines, err)
    assert err.strip() == "interrupted", err


async def test_a_body_that_saw_ctrl_c_finishes_its_cleanup() -> None:
    code, lines, err = await _interrupted(CLEANS_UP.format(cleanup_s=1.0), presses=("ready",))  # 4 recancel periods
    assert code == 130 and lines == ["ready", "cleaning", "cleaned"], (code, lines, err)


async def test_a_second_ctrl_c_stops_the_cleanup() -> None:
    code, lines, err = await _interrupted(CLEANS_UP.format(cleanup_s=60), presses=("ready", "cleaning"))
    assert code == 130 and lines == ["ready", "cleaning"], (code, lines, err)
    assert "Traceback" not in err, err
