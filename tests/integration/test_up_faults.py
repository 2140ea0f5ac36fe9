"""``reel up``'s faults explain themselves (real processes): a crash-looping child's restart backoff starts again
after a stable run and the supervisor says why it gives up; an unreachable ``NATS_URL`` is one line naming it within
seconds, from ``reel up`` and ``reel run`` alike."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reel.services.cli.supervisor import Backoff, keep_child
from tests.integration.test_auth_cli import _free_port, reel

CRASHER = """n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}
case $n in 1|2|3) exit 3;; 4) sleep {stable_s}; exit 4;; *) exit 5;; esac"""
"""Crashes at once three times, then runs ``stable_s`` (a stable run) and exits, then crashes at once for ever."""


async def test_the_restart_backoff_starts_again_after_a_stable_run_and_giving_up_says_why(tmp_path: Path) -> None:
    backoff = Backoff(first_s=0.1, max_s=2.0, stable_s=1.5, give_up_after=4)
    script = CRASHER.format(count=tmp_path / "count", stable_s=backoff.stable_s + 0.5)
    lines: list[str] = []
    reason = await asyncio.wait_for(keep_child("crasher#0", ["/bin/sh", "-c", script], {}, asyncio.Event(),
                                               backoff, say=lines.append), 60)
    delays = [float(m.group(1)) for ln in lines if (m := re.search(r"restarting in ([0-9.]+)s", ln))]
    assert delays == [0.1, 0.2, 0.4, 0.1, 0.2, 0.4], lines  # without the reset: 0.8, 1.6, 2.0 after the stable run
    assert "exit code 4 after 2." in lines[3] and "(1/4 in a row)" in lines[3], lines
    assert reason is not None and reason.startswith("crasher#0 exited with exit code 5 after "), reason
    assert "gave up: 4 crashes in a row, each within 1.5s of its start" in reason
    assert (tmp_path / "count").read_text().strip() == "7"


@pytest.fixture
async def silent_url() -> AsyncIterator[str]:
    """A TCP listener that accepts connections and never says anything (no NATS INFO): a black hole."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        for w in held:
            w.close()
        server.close()


async def test_reel_up_and_reel_run_on_an_unreachable_nats_url_fail_within_seconds_naming_it(
        tmp_path: Path, silent_url: str) -> None:
    refused_url = f"nats://127.0.0.1:{_free_port()}"  # nothing listens there
    env = {"REEL_HOME": str(tmp_path / "home")}

    async def timed(*args: str) -> tuple[float, int, str]:
        started = time.monotonic()
        code, out, err = await reel(*args, env=env, timeout_s=90)
        return time.monotonic() - started, code, out + err

    cases = [(cmd, url) for cmd in (("up",), ("run", "examples/hello.yaml")) for url in (refused_url, silent_url)]
    for cmd, url in cases:  # one at a time: four CLIs starting at once on a busy machine take 20 s to import
        took_s, code, said = await timed(*cmd, "--nats-url", url)
        assert code != 0 and url in said and ("cannot reach" in said or "connection refused" in said), (cmd, said)
        assert took_s < 25, (cmd, url, took_s)  # 10 s at most waiting for an answer, the rest is start-up
        assert "Traceback" not in said, said


async def test_reel_up_on_a_taken_port_says_so_in_one_line(tmp_path: Path, silent_url: str) -> None:
    """A second ``reel up`` (another store, the same port) was a 95-line traceback ending in nats-server's log."""
    port = silent_url.rsplit(":", 1)[1]
    code, out, err = await reel("up", "--port", port, env={"REEL_HOME": str(tmp_path / "home")}, timeout_s=90)
    said = out + err
    assert code == 1 and "Traceback" not in said, said
    assert f"127.0.0.1:{port} is in use" in said and f"--nats-url nats://127.0.0.1:{port}" in said, said
