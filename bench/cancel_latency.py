"""Benchmark: how long a cancel takes to stop the work a run has in flight.

One embedded nats-server (file storage, R1); the executor and the cancel service in this
process (as in the tests), the loopback chat-completions server of the tests. Three cases,
``--tries`` runs each (default 20), one run at a time:

* **command** — a tool step running ``sh -c 'sleep 20 & …; wait'`` (its group: the shell and a
  background ``sleep``); gone = both processes have exited (pidfds, then ``kill(-pgid, 0)``);
* **python** — an agent's call of an async Python tool awaiting an event nobody sets; gone = the
  tool's coroutine caught its ``CancelledError``;
* **model** — an agent turn whose request the server never answers; gone = the server saw the
  client close the connection.

Each try waits (rendezvous, no sleeps) until the work runs, then times from just before
``client.cancel()`` to "gone" (**stop**), and to the cancel's reply (**reply**: the command's round
trip through JetStream and the cancel service's fenced commit). The attempt is checked recorded
``cancelled`` before the next try. Milliseconds: p50, p90, max.

    python bench/cancel_latency.py [--tries 20] [--cases command,python,model]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the tests' tools and loopback server

from _bench_common import bench_server, console, machine_note, median, namespace, pct  # noqa: E402
from rich.table import Table  # noqa: E402

from reel.services.cancel.app import serve as cancel_serve  # noqa: E402
from reel.services.executor.app import serve as executor_serve  # noqa: E402
from reel.shared.core.workflow.spec import parse_workflow  # noqa: E402
from reel.shared.nats.client import ReelClient  # noqa: E402
from reel.shared.nats.eventlog import JetStreamEventLog  # noqa: E402
from reel.shared.nats.infra import Infra  # noqa: E402
from reel.shared.runtime.config import Config  # noqa: E402
from reel.shared.runtime.logging import setup_logging  # noqa: E402
from tests.integration import cancel_support as cs  # noqa: E402
from tests.support.chat_server import ChatServer, Hang, hang  # noqa: E402

Case = Callable[[ReelClient, Path, ChatServer], Awaitable[tuple[str, float, float]]]


def _agent(tools: list[dict[str, Any]], call: dict[str, Any] | None, model: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    scripted = {"adapter": "scripted", "turns": [{"tool_calls": [call]}, {"text": "done"}]}
    return {"name": "bench-cancel", "steps": [{
        "kind": "agent", "id": "solve", "instructions": "Work.", "context": [{"id": "task", "kind": "task",
                                                                              "text": "wait"}],
        "model": model or scripted, "tools": tools}]}


async def _timed(client: ReelClient, run_id: str, gone: Callable[[], Awaitable[float]]) -> tuple[float, float]:
    replied: list[float] = []
    t0 = time.monotonic()
    cancel = asyncio.ensure_future(client.cancel(run_id, "bench"))
    cancel.add_done_callback(lambda _: replied.append(time.monotonic()))
    seen = await asyncio.wait_for(gone(), 10)
    reply = await cancel
    assert reply.ok and reply.status == "cancelled", reply
    return (seen - t0) * 1000, (replied[0] - t0) * 1000


async def command(client: ReelClient, tmp: Path, _: ChatServer) -> tuple[str, float, float]:
    pids = cs.fifo(tmp)
    started = await client.start(parse_workflow({"name": "bench-cmd", "steps": [
        {"kind": "tool", "id": "slow", "tool": {"type": "command", "argv": cs.sleeper_argv(pids)}}]}))
    assert started.run_id
    leader, child = await cs.fifo_rendezvous(pids)

    async def gone() -> float:
        return max(await asyncio.gather(cs.exited(leader), cs.exited(child)))
    timed = await _timed(client, started.run_id, gone)
    await cs.group_gone(leader)  # and no member of the group runs any more
    return (started.run_id, *timed)


async def python(client: ReelClient, _: Path, __: ChatServer) -> tuple[str, float, float]:
    gate = cs.arm()
    tool = {"name": "wait", "python": "tests.integration.cancel_support:wait_forever", "timeout_s": 60,
            "parameters": {"type": "object", "properties": {"token": {"type": "string"}}}}
    started = await client.start(parse_workflow(_agent([tool], {"name": "wait", "arguments": {"token": gate.token}})))
    assert started.run_id
    await asyncio.wait_for(gate.started.wait(), 30)

    async def gone() -> float:
        await gate.stopped.wait()
        return gate.stopped_at
    return (started.run_id, *await _timed(client, started.run_id, gone))


async def model(client: ReelClient, _: Path, server: ChatServer) -> tuple[str, float, float]:
    signal = Hang()
    server.script(hang(signal))
    spec = _agent([], None, {"adapter": "openai", "base_url": server.url, "model": "loopback-1", "timeout_s": 60})
    started = await client.start(parse_workflow(spec))
    assert started.run_id
    await asyncio.wait_for(signal.arrived.wait(), 30)

    async def gone() -> float:
        await signal.closed.wait()
        return signal.closed_at
    return (started.run_id, *await _timed(client, started.run_id, gone))


CASES: dict[str, Case] = {"command": command, "python": python, "model": model}
STEP = {"command": "slow", "python": "solve:t1:c0", "model": "solve:t1"}


@contextlib.asynccontextmanager
async def _services(infra: Infra, cfg: Config) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(serve(infra, cfg, stop)) for serve in (executor_serve, cancel_serve)]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)


async def _recorded_cancelled(log: JetStreamEventLog, run_id: str, step: str) -> None:
    for _ in range(500):
        attempts = (await log.load(run_id)).branches["main"].attempts.get(step, ())
        if attempts and attempts[0].status == "cancelled":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{run_id}: {step} was not recorded cancelled")


async def main(tries: int, cases: list[str]) -> None:
    rows: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in cases}
    server = ChatServer()
    await server.start()
    try:
        async with bench_server() as srv, namespace(srv, "benchcancel") as b:
            client = ReelClient(b.nc, b.cfg)
            log = JetStreamEventLog(b.nc, b.cfg.names)
            with tempfile.TemporaryDirectory() as tmp:
                async with _services(b.infra, b.cfg):
                    for name in cases:
                        for _ in range(tries):
                            run_id, stop_ms, reply_ms = await CASES[name](client, Path(tmp), server)
                            await _recorded_cancelled(log, run_id, STEP[name])
                            rows[name][0].append(stop_ms)
                            rows[name][1].append(reply_ms)
    finally:
        await server.stop()
    table = Table(title=f"cancel latency, {tries} tries per case (ms)")
    for col in ("case", "stop p50", "stop p90", "stop max", "reply p50", "reply max"):
        table.add_column(col, justify="right")
    for name, (stops, replies) in rows.items():
        table.add_row(name, f"{median(stops):.1f}", f"{pct(stops, 90):.1f}", f"{max(stops):.1f}",
                      f"{median(replies):.1f}", f"{max(replies):.1f}")
    console.print(table)
    console.print(machine_note())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--cases", default="command,python,model")
    args = ap.parse_args()
    setup_logging("bench", level="WARNING")
    asyncio.run(main(args.tries, [c for c in args.cases.split(",") if c]))
