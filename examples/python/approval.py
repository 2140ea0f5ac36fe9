"""examples/agent/approval.yaml in Python: the scripted model asks to deploy (a tool that needs approval) and asks
the user a question (the built-in ``ask_user`` tool) in one turn; the run rests in ``awaiting_input`` until both
are answered. Same workflow, same commits.

Run from the repository root:  python -m examples.python.approval
"""

from __future__ import annotations

import asyncio

import reel

TASK = "Deploy the release to staging."

deploy = reel.recorded_tool(
    "deploy", "deployed", description="Deploy the build to an environment.", needs_approval=True,
    ask=reel.Ask(ask="release managers", timeout_s=86400, default="reject", note="nobody approved within a day"),
    parameters={"type": "object", "properties": {"env": {"type": "string"}, "version": {"type": "string"}},
                "required": ["env"]})

agent = reel.Agent(
    name="approval-demo", step_id="ship",
    description="a deploy that waits for a human's approval, and a question for the user",
    instructions="Release the build. Ask before deploying.",
    model=reel.ScriptedModel(turns=[
        {"tool_calls": [{"name": "deploy", "arguments": {"env": "staging"}},
                        {"name": "ask_user", "arguments": {"question": "Which version should go out?"}}]},
        {"text": "Deployed to staging."}]),
    tools=[deploy, reel.ask_user(ask=reel.Ask(ask="the requester"))],
    verifiers=[reel.Verifier(type="output_regex", name="says-deployed", pattern="Deployed")])


async def main() -> None:
    async with reel.local() as client:
        run = await client.start(agent, input=TASK)
        print((await run.result()).status)  # awaiting_input
        for request in await run.pending():  # answer both, as `reel answer` / `reel approve` would
            if request.kind == "question":
                await run.answer(request.request_id, "v2")
            else:
                await run.approve(request.request_id, arguments={"env": "staging", "version": "v2"})
        result = await run.result()
        print(result.outcome, result.output)


if __name__ == "__main__":
    asyncio.run(main())
