"""examples/agent/fix_typo_live.yaml in Python: the fix-typo agent against a real OpenAI-compatible endpoint,
chosen by the same environment variables (``REEL_AGENT_BASE_URL``, default OpenAI's; ``REEL_AGENT_MODEL``,
default ``gpt-4o-mini``; ``REEL_AGENT_PROFILE``, the server's wire profile, default ``openai``); the key is read
from ``$OPENAI_API_KEY`` by the executor. Same workflow, same commits.

Run from the repository root:  REEL_AGENT_BASE_URL=http://127.0.0.1:11434/v1 REEL_AGENT_MODEL=qwen2.5-coder:7b \\
    OPENAI_API_KEY=unused python -m examples.python.fix_typo_live
"""

from __future__ import annotations

import os

import reel
from examples.python.fix_typo import TASK, fixer


def live_agent() -> reel.Agent:
    """The agent with the endpoint the environment names now."""
    return fixer(reel.OpenAIModel(
        base_url=os.environ.get("REEL_AGENT_BASE_URL", "https://api.openai.com/v1"),
        model=os.environ.get("REEL_AGENT_MODEL", "gpt-4o-mini"),
        profile=os.environ.get("REEL_AGENT_PROFILE", "openai"),
        api_key_env="OPENAI_API_KEY", params={"temperature": 0}, timeout_s=120))


if __name__ == "__main__":
    result = reel.run_sync(live_agent(), input=TASK)
    print(result.outcome, result.output)
