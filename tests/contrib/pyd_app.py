"""A Pydantic AI app as a user writes it (tests/contrib): a calculator agent with two function tools, its model
an ``OpenAIChatModel`` on the loopback chat-completions server, made durable by ``ReelDurability``.

``python -m tests.contrib.pyd_app <base_url> <store_dir> <effects_file> [block]`` runs it durably through
``reel.contrib.pydantic_ai.run`` in a ``reel.local(store_dir=…)`` and prints the final output; each tool
appends a line to ``effects_file`` when it finishes; with ``block``, ``mul`` waits until ``add``'s outcome is
in the log, prints ``IN-MUL`` and waits forever (the test kills the process there).

``python -m tests.contrib.pyd_app <base_url> <store_dir> <effects_file> refund [block]`` runs the ``support``
agent instead (its ``refund`` tool ``requires_approval``): it prints ``AWAITING <nats url>`` once the run waits
for the approval; with ``block``, the approved ``refund`` prints ``IN-REFUND`` and waits forever.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import reel
from reel.contrib import pydantic_ai
from reel.contrib.pydantic_ai import ReelDurability


def _effect(effects: Path, line: str) -> None:
    """Count a finished call: one line appended to ``effects``."""
    with effects.open("a") as f:
        f.write(line + "\n")


CLIENT: list[reel.Client] = []
"""The client of ``main`` (the gated ``mul`` reads the run's log through it)."""


async def add_recorded() -> None:
    """Until the run's log holds ``add``'s outcome (so a kill after it leaves a finished call behind)."""
    client = CLIENT[0]
    while True:
        for run_id in await client.runs():
            branch = (await client.get(run_id).state()).active
            if any(a.status == "succeeded" for a in branch.attempts.get("calc:t1:c0", ())):
                return
        await asyncio.sleep(0.05)


def model(base_url: str) -> OpenAIChatModel:
    return OpenAIChatModel("loopback-1", provider=OpenAIProvider(base_url=base_url, api_key="loopback"))


def build(base_url: str, effects: Path, block: bool = False) -> Agent[None, str]:
    agent = Agent(model(base_url), name="calc", instructions="Compute with the tools.",
                  capabilities=[ReelDurability()])

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        _effect(effects, f"add {a} {b}")
        return a + b

    @agent.tool_plain
    async def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        if block:
            await add_recorded()
            print("IN-MUL", flush=True)  # the test kills the process now
            await asyncio.Event().wait()
        _effect(effects, f"mul {a} {b}")
        return a * b

    return agent


def refund_agent(base_url: str, effects: Path, block: bool = False) -> Agent[None, str]:
    agent = Agent(model(base_url), name="support", instructions="Refund when asked.",
                  capabilities=[ReelDurability()])

    @agent.tool_plain(requires_approval=True)
    async def refund(order: str) -> str:
        """Refund an order."""
        if block:
            print("IN-REFUND", flush=True)  # the test kills the process now
            await asyncio.Event().wait()
        _effect(effects, f"refund {order}")
        return f"refunded {order}"

    return agent


async def refund_main(base_url: str, store: Path, effects: Path, block: bool) -> None:
    async with reel.local(store_dir=store) as client:
        handle = client.get(pydantic_ai.run_id("pyd-refund"))

        async def awaiting() -> None:
            await handle.wait(("awaiting_input",), timeout_s=60)
            print(f"AWAITING {client.url}", flush=True)

        told = asyncio.ensure_future(awaiting()) if block else None
        result = await pydantic_ai.run(refund_agent(base_url, effects, block), "Refund A-17.", client=client,
                                       key="pyd-refund")
        print(f"FINAL {result.output}", flush=True)
        if told is not None:
            told.cancel()


async def main(base_url: str, store: Path, effects: Path, block: bool) -> None:
    agent = build(base_url, effects, block)
    async with reel.local(store_dir=store) as client:
        CLIENT.append(client)
        result = await pydantic_ai.run(agent, "What are 2+3 and 4*5?", client=client, key="pyd-test")
        print(f"FINAL {result.output}", flush=True)


if __name__ == "__main__":
    rest = sys.argv[4:]
    entry = refund_main if rest[:1] == ["refund"] else main
    asyncio.run(entry(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), rest[-1:] == ["block"]))
