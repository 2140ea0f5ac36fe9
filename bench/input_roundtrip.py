"""Benchmark: the open-request round trip, and how late a deadline's default lands.

Against one embedded nats-server (file storage, R1), with the real executor, the cancel
service (which answers ``<ns>.cmd.respond``) and recovery running in this process:

1. **approve → dispatched** — ``--runs`` runs of an agent whose first turn calls one
   ``recorded`` tool that needs approval. Each run rests in ``awaiting_input`` (its
   request committed); then the clock starts, ``reel.cmd.respond`` approves, and it stops
   when the commit holding the tool call's ``attempt_dispatched`` arrives on a core
   subscription to the run's subject (no polling). Also split: approve sent → the reply
   (the answer committed), and the answer's commit → the dispatch commit (their
   ``at_ms``, the writers' clocks). The path: respond decides and commits fenced,
   publishes ``ResumeRun``; an executor takes the resume, loads the run, claims it,
   plans, commits the call's intent.
2. **deadline lateness** — ``--runs`` runs whose request has ``timeout_s: 0.2`` and
   default ``reject``: ``input_answered.at_ms − deadline_ms`` (recovery's sweep wakes
   for the earliest deadline).

    python bench/input_roundtrip.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._bench_common import bench_server, console, machine_note, median, namespace, pct
from reel.services.cancel.app import serve as cancel_serve
from reel.services.executor.app import serve as executor_serve
from reel.services.recovery.app import serve as recovery_serve
from reel.shared.core.input import requestfold
from reel.shared.core.run.events import AttemptDispatched, InputAnswered, decode_commit
from reel.shared.core.workflow.spec import WorkflowSpec, parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.runtime.logging import setup_logging


def workflow(i: int, deadline_s: float | None) -> WorkflowSpec:
    tool: dict[str, Any] = {"name": "deploy", "recorded": {"output": "deployed"}, "needs_approval": True,
                            "parameters": {"type": "object", "properties": {"env": {"type": "string"}}}}
    if deadline_s is not None:
        tool["input"] = {"timeout_s": deadline_s, "default": "reject", "note": "timed out"}
    return parse_workflow({"name": f"bench-input-{i}", "steps": [{
        "kind": "agent", "id": "ship", "context": [{"id": "task", "kind": "task", "text": f"deploy build {i}"}],
        "model": {"adapter": "scripted", "turns": [
            {"tool_calls": [{"name": "deploy", "arguments": {"env": "staging"}}]}, {"text": "done"}]},
        "tools": [tool]}]})


async def main(runs: int) -> None:
    async with bench_server() as srv, namespace(srv, "bench_input") as b:
        client = ReelClient(b.nc, b.cfg)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(s(b.infra, b.cfg, stop)) for s in (executor_serve, cancel_serve,
                                                                          recovery_serve)]
        total, reply, logged, late = [], [], [], []
        try:
            for i in range(runs):
                started = await client.start(workflow(i, None))
                assert started.run_id
                run_id = started.run_id
                state = await client.wait_for(run_id, ("awaiting_input",), timeout_s=30)
                (request,) = requestfold.open_requests(state.branches[state.active_branch])
                dispatched: asyncio.Future[float] = asyncio.get_running_loop().create_future()
                at_ms: dict[str, int] = {}

                async def on_commit(msg: Any, fut: asyncio.Future[float] = dispatched,
                                    seen: dict[str, int] = at_ms, step: str = request.step_id) -> None:
                    for e in decode_commit(msg.data).events:
                        if isinstance(e, InputAnswered):
                            seen["answered"] = e.at_ms
                        if isinstance(e, AttemptDispatched) and e.step_id == step and not fut.done():
                            seen["dispatched"] = e.at_ms
                            fut.set_result(time.perf_counter())

                sub = await b.nc.subscribe(b.cfg.names.events(run_id), cb=on_commit)
                t0 = time.perf_counter()
                answer = await client.respond(run_id, request.request_id, "approve")
                t1 = time.perf_counter()
                t2 = await asyncio.wait_for(dispatched, 30)
                await sub.unsubscribe()
                assert answer.ok, answer
                total.append((t2 - t0) * 1000)
                reply.append((t1 - t0) * 1000)
                logged.append(float(at_ms["dispatched"] - at_ms["answered"]))
                await client.wait_for(run_id, ("verifying",), timeout_s=30)
            for i in range(runs):
                started = await client.start(workflow(i, 0.2))
                assert started.run_id
                state = await client.wait_for(started.run_id, ("verifying",), timeout_s=30)
                (rec,) = requestfold.requests_of(state.branches[state.active_branch]).values()
                assert rec.response is not None and rec.deadline_ms is not None and rec.response.source == "deadline"
                late.append(float(rec.response.at_ms - rec.deadline_ms))
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    console.print(machine_note())
    for name, values in (("approve sent → tool call dispatched (ms)", total),
                         ("approve sent → reply: answer committed (ms)", reply),
                         ("answer commit → dispatch commit, at_ms (ms)", logged),
                         ("deadline → default committed, at_ms (ms)", late)):
        console.print(f"{name:48s} p50 {median(values):7.1f}  p90 {pct(values, 90):7.1f}  max {max(values):7.1f}"
                      f"  (n={len(values)})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    setup_logging("bench", level="WARNING")
    asyncio.run(main(parser.parse_args().runs))
