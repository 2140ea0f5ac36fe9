"""An OpenAI Agents SDK app as a user writes it (tests/contrib): a triage agent with two function tools and a
handoff to a writer, its model an ``OpenAIChatCompletionsModel`` on the loopback chat-completions server.

``python -m tests.contrib.oa_app <base_url> <store_dir> <effects_file> [block]`` runs it durably through
``reel.contrib.openai_agents.run`` in a ``reel.local(store_dir=…)`` and prints the final output; each tool
appends a line to ``effects_file`` when it finishes; with ``block``, ``mul`` waits until ``add``'s outcome is
in the log, prints ``IN-MUL`` and waits forever (the test kills the process there).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

import reel
from reel.contrib import openai_agents


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
            if any(a.status == "succeeded" for a in branch.attempts.get("triage:t1:c0", ())):
                return
        await asyncio.sleep(0.05)


def build(base_url: str, effects: Path, block: bool = False) -> Agent[None]:
    model = OpenAIChatCompletionsModel(model="loopback-1",
                                       openai_client=AsyncOpenAI(base_url=base_url, api_key="loopback"))

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        _effect(effects, f"add {a} {b}")
        return a + b

    @function_tool
    async def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        if block:
            await add_recorded()
            print("IN-MUL", flush=True)  # the test kills the process now
            await asyncio.Event().wait()
        _effect(effects, f"mul {a} {b}")
        return a * b

    writer = Agent(name="writer", instructions="Write the answer.", model=model)
    return Agent(name="triage", instructions="Compute, then hand off to the writer.", model=model,
                 tools=[add, mul], handoffs=[writer])


async def main(base_url: str, store: Path, effects: Path, block: bool) -> None:
    set_tracing_disabled(True)
    agent = build(base_url, effects, block)
    async with reel.local(store_dir=store) as client:
        CLIENT.append(client)
        result = await openai_agents.run(agent, "What are 2+3 and 4*5?", client=client, key="oa-test")
        print(f"FINAL {result.last_agent.name}: {result.final_output}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:] == ["block"]))
