"""A Reel client that is not Reel's: plain nats-py, the documented subjects and JSON only.

It starts a run and prints its verdicts, using nothing but docs/subjects.md and
docs/schemas/ — no import from Reel — to show that any NATS client in any
language can drive Reel:

1. publish a ``StartRun`` JSON (docs/schemas/start_run.json) on ``<ns>.cmd.start``
   through JetStream (the command is durably queued even if no executor is up),
   with the header ``Reel-Reply-To: <inbox>``;
2. wait on that inbox for the ``Reply`` (docs/schemas/reply.json): ``run_id``;
3. read the verdicts (docs/schemas/verdict.json) from ``<ns>.verdict.<run_id>``
   with an ordered JetStream consumer, which replays the verdict stream from the
   start, so verdicts published before we subscribed are not missed.

Usage::

    python examples/plain_client.py [--url nats://127.0.0.1:4222] [--namespace reel] [--workflow FILE.json]

Prints one JSON line for the reply and one per verdict. Exit status: 0 if every
verdict passed, 1 if one failed or errored, 2 if the command was refused or
nothing answered in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import nats

# A workflow (docs/schemas/workflow.json): one recorded tool step, two verifiers.
DEFAULT_WORKFLOW: dict[str, Any] = {
    "name": "plain-client-demo",
    "steps": [
        {"kind": "tool", "id": "greet", "tool": {"type": "recorded", "input": "echo hello",
                                                  "output": '{"greeting": "hello, world"}'}},
    ],
    "verifiers": [
        {"type": "output_regex", "name": "says-hello", "pattern": "hello"},
        {"type": "output_json_schema", "name": "is-greeting",
         "json_schema": {"type": "object", "required": ["greeting"]}},
    ],
}


def expected_verifiers(workflow: dict[str, Any]) -> list[str]:
    """Verdict names to wait for: each verifier's ``name``, defaulting to its ``type``."""
    return [v.get("name") or v["type"] for v in workflow.get("verifiers", [])]


async def start_run(nc: nats.NATS, namespace: str, workflow: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Publish StartRun on ``<ns>.cmd.start`` and return the Reply from our inbox."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=1)
    body = json.dumps({"workflow": workflow, "idempotency_key": f"plain-{uuid.uuid4().hex}"}).encode()
    await nc.jetstream().publish(f"{namespace}.cmd.start", body, headers={"Reel-Reply-To": inbox})
    msg = await sub.next_msg(timeout=timeout_s)
    reply: dict[str, Any] = json.loads(msg.data)
    return reply


async def read_verdicts(nc: nats.NATS, namespace: str, run_id: str, names: list[str],
                        timeout_s: float) -> list[dict[str, Any]]:
    """Replay ``<ns>.verdict.<run_id>`` until a verdict for each of ``names`` arrived."""
    sub = await nc.jetstream().subscribe(f"{namespace}.verdict.{run_id}", ordered_consumer=True)
    got: dict[str, dict[str, Any]] = {}
    try:
        while set(names) - set(got):
            msg = await sub.next_msg(timeout=timeout_s)
            verdict = json.loads(msg.data)
            got.setdefault(verdict["verifier"], verdict)
    finally:
        await sub.unsubscribe()
    return [got[n] for n in names]


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start a Reel run and print its verdicts (plain nats-py).")
    parser.add_argument("--url", default="nats://127.0.0.1:4222", help="NATS server URL")
    parser.add_argument("--namespace", default="reel", help="Reel namespace (subject prefix)")
    parser.add_argument("--workflow", type=Path, help="workflow JSON file (default: a built-in demo)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply / each verdict")
    args = parser.parse_args(argv)
    workflow = json.loads(args.workflow.read_text()) if args.workflow else DEFAULT_WORKFLOW

    nc = await nats.connect(args.url)
    try:
        try:
            reply = await start_run(nc, args.namespace, workflow, args.timeout)
        except nats.errors.TimeoutError:
            print(json.dumps({"error": "no reply to start (is an executor running?)"}), file=sys.stderr)
            return 2
        print(json.dumps({"reply": reply}))
        if not reply.get("ok"):
            return 2
        try:
            verdicts = await read_verdicts(nc, args.namespace, reply["run_id"], expected_verifiers(workflow),
                                           args.timeout)
        except nats.errors.TimeoutError:
            print(json.dumps({"error": "verdicts did not arrive (is a verifier running?)"}), file=sys.stderr)
            return 2
        for v in verdicts:
            print(json.dumps({"verdict": v}))
        return 0 if all(v["status"] == "pass" for v in verdicts) else 1
    finally:
        await nc.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
