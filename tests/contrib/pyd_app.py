"""A Pydantic AI app as a user writes it (tests/contrib): a calculator agent with two function tools, its model
an ``OpenAIChatModel`` on the loopback chat-completions server, made durable by ``ReelDurability``.

``python -m tests.contrib.pyd_app <base_url> <store_dir> <effects_file> [block]`` runs it durably through
``reel.contrib.pydantic_ai.run`` in a ``reel.local(store_dir=…)`` and prints the final output; each tool
appends a line to ``effects_file`` when it finishes; with ``block``, ``mul`` waits until ``add``'s outcome is
in the log, prints ``IN-MUL`` and waits forever (the test kills the process there).
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
            branch = (s := await client.get(run_id).state()).branches[s.active_branch]
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


async def main(base_url: str, store: Path, effects: Path, block: bool) -> None:
    agent = build(base_url, effects, block)
    async with reel.local(store_dir=store) as client:
        CLIENT.append(client)
        result = await pydantic_ai.run(agent, "What are 2+3 and 4*5?", client=client, key="pyd-test")
        print(f"FINAL {result.output}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:] == ["block"]))
