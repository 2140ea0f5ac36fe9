"""The loopback chat-completions server of bench/live_agents.py (not part of Reel), run as a child process.

``python bench/_live_server.py PORT LATENCY_S CHUNKS TURNS``: serves ``POST /v1/chat/completions``
as a model that plays a fixed agent script. The run is the ``live-run:<n>`` marker in the request's
messages; its turn is one more than the number of ``tool`` messages it carries. Turns 1…TURNS−1 call
the tool ``noop`` once (arguments ``{"run": n, "step": turn}``); turn TURNS answers text. Each answer
takes LATENCY_S from the request's arrival to its last byte: streamed (``stream: true``) as CHUNKS
server-sent ``chat.completion.chunk`` events spread evenly over it, plus the usage chunk and
``[DONE]``; else one JSON body after LATENCY_S.

``GET /stats`` returns (and forgets) what it saw: ``{"calls": [[run, turn, arrived_s, done_s], …]}``
(Unix seconds, ``time.time()``), so a driver can subtract the model's time from a run's wall time.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from typing import Any

from aiohttp import web

MARK = re.compile(r"live-run:(\d+)")


class Script:
    """The agent script, its latency and what was served (see the module doc)."""

    def __init__(self, latency_s: float, chunks: int, turns: int) -> None:
        self.latency_s, self.chunks, self.turns = latency_s, max(3, chunks), turns
        self.calls: list[list[float]] = []

    def answer(self, body: dict[str, Any]) -> tuple[int, int, str, list[dict[str, Any]]]:
        """(run, turn, text, tool calls) the script plays for ``body``."""
        messages = body.get("messages") or []
        found = next((m for m in (MARK.search(str(x.get("content") or "")) for x in messages) if m), None)
        run = int(found.group(1)) if found else -1
        turn = 1 + sum(1 for x in messages if x.get("role") == "tool")
        if turn >= self.turns:
            return run, turn, f"done: run {run} finished after {turn} turns", []
        args = json.dumps({"run": run, "step": turn})
        return run, turn, "", [{"id": f"call_{run}_{turn}", "type": "function",
                                "function": {"name": "noop", "arguments": args}}]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.time()
        body = json.loads(await request.read())
        run, turn, text, calls = self.answer(body)
        if body.get("stream"):
            resp = await self._stream(request, body, text, calls, arrived)
        else:
            await asyncio.sleep(max(0.0, arrived + self.latency_s - time.time()))
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            resp = web.json_response({
                "id": "chatcmpl-live", "object": "chat.completion", "created": int(arrived), "model": "loopback",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": 40 * turn, "completion_tokens": 12, "total_tokens": 40 * turn + 12}})
        self.calls.append([run, turn, arrived, time.time()])
        return resp

    async def _stream(self, request: web.Request, body: dict[str, Any], text: str, calls: list[dict[str, Any]],
                      arrived: float) -> web.StreamResponse:
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        pieces = self.chunks - 2
        if calls:
            call = calls[0]
            args = call["function"]["arguments"]
            deltas.append({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                           "function": {"name": "noop", "arguments": ""}}]})
            step = max(1, -(-len(args) // max(1, pieces - 1)))
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + step]}}]}
                       for i in range(0, len(args), step)]
        else:
            step = max(1, -(-len(text) // pieces))
            deltas += [{"content": text[i:i + step]} for i in range(0, len(text), step)]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        n = len(deltas) + 1
        for i, delta in enumerate([*deltas, None]):
            await asyncio.sleep(max(0.0, arrived + self.latency_s * (i + 1) / n - time.time()))
            choice: dict[str, Any] = {"index": 0, "delta": delta or {},
                                      "finish_reason": None if delta else ("tool_calls" if calls else "stop")}
            await resp.write(_event({"id": "chatcmpl-live", "object": "chat.completion.chunk",
                                     "created": int(arrived), "model": "loopback", "choices": [choice]}))
        turn = 1 + sum(1 for x in body.get("messages") or [] if x.get("role") == "tool")
        await resp.write(_event({"id": "chatcmpl-live", "object": "chat.completion.chunk", "created": int(arrived),
                                 "model": "loopback", "choices": [],
                                 "usage": {"prompt_tokens": 40 * turn, "completion_tokens": 12,
                                           "total_tokens": 40 * turn + 12}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def stats(self, _: web.Request) -> web.Response:
        calls, self.calls = self.calls, []
        return web.json_response({"calls": calls})


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def main() -> None:
    port, latency_s, chunks, turns = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    script = Script(latency_s, chunks, turns)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", script.handle)
    app.router.add_get("/stats", script.stats)
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=4096, access_log=None)


if __name__ == "__main__":
    main()
