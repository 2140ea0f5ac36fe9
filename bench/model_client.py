"""Client-side CPU and memory per model call: one pooled ``AsyncOpenAI`` client vs a new client per call.

A loopback chat-completions server (aiohttp, in a child process so its CPU is not counted) answers every
``POST /v1/chat/completions`` at once with a short answer and its usage. This process makes ``--calls``
calls through :class:`reel.shared.models.openai.OpenAIAdapter` (the pooled client the executor uses) and
the same number through the old path, a new ``openai.AsyncOpenAI`` built and closed for each call
(the baseline), ``--concurrency`` at a time, the two interleaved in ``--rounds`` rounds. Per call:
this process's CPU (``time.process_time``, ms) and wall time; after each variant, its RSS (MB).

Usage: ``python bench/model_client.py [--calls 300] [--concurrency 20] [--rounds 3]``; last line:
``ratio cpu_per_call pooled_vs_per_call=<x>`` (below 1: the pool is cheaper).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import msgspec
import openai
from _bench_common import machine_note

from reel.shared.core.chat.messages import ChatMessage, chat_request, wire_request
from reel.shared.core.workflow.modelspec import ModelSpec
from reel.shared.models import make_chat_model

SERVER = r"""
import sys
from aiohttp import web
ANSWER = {"id": "c", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
          "message": {"role": "assistant", "content": "done"}}],
          "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}}
async def answer(request):
    await request.read()
    return web.json_response(ANSWER)
app = web.Application()
app.router.add_post("/v1/chat/completions", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until_listening(port: int, within_s: float = 20) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def measure(call: Callable[[], Awaitable[object]], calls: int, concurrency: int) -> tuple[float, float]:
    """(CPU ms per call, wall ms per call) of ``calls`` calls, ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await call()

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    return (time.process_time() - cpu) * 1000 / calls, (time.perf_counter() - wall) * 1000 / calls


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    port = free_port()
    server = await asyncio.create_subprocess_exec(sys.executable, "-c", SERVER, str(port))
    try:
        await until_listening(port)
        url = f"http://127.0.0.1:{port}/v1"
        spec = msgspec.convert({"adapter": "openai", "base_url": url, "model": "m", "timeout_s": 10}, ModelSpec)
        request = chat_request(spec, run_id="r-bench", step_id="s:t1", attempt=1, turn=1, tools=(),
                               messages=[ChatMessage(role="user", content="hi")])
        model = make_chat_model(spec)
        body = wire_request(request)

        async def pooled() -> object:
            return await model.complete_chat(request)

        async def per_call() -> object:  # the old path: a client (pool, TLS context) built and closed per call
            async with openai.AsyncOpenAI(api_key="x", base_url=url, timeout=10, max_retries=0) as client:
                return await client.chat.completions.with_raw_response.create(
                    model=body["model"], messages=body["messages"],
                    extra_body={k: v for k, v in body.items() if k not in ("model", "messages")})

        await pooled(), await per_call()  # warm both paths (imports, first connection)
        rows: dict[str, list[tuple[float, float]]] = {"pooled": [], "per-call (baseline)": []}
        for _ in range(args.rounds):
            for name, fn in (("per-call (baseline)", per_call), ("pooled", pooled)):
                rows[name].append(await measure(fn, args.calls, args.concurrency))
    finally:
        server.terminate()
        await server.wait()

    print(machine_note())
    print(f"{args.calls} calls x {args.rounds} rounds, {args.concurrency} at a time, loopback server in a child")
    print(f"{'variant':<22}{'cpu ms/call':>14}{'wall ms/call':>14}")
    med = {}
    for name, vals in rows.items():
        med[name] = statistics.median(c for c, _ in vals)
        print(f"{name:<22}{med[name]:>14.3f}{statistics.median(w for _, w in vals):>14.3f}")
    print(f"ratio cpu_per_call pooled_vs_per_call={med['pooled'] / med['per-call (baseline)']:.3f}")


if __name__ == "__main__":
    asyncio.run(main())
