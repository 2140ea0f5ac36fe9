"""The loopback model of the crucible-agent example: how it answers depends on the agent's instructions.

It is the test suite's loopback chat-completions server (tests/support/chat_server.py, real HTTP on a free
127.0.0.1 port) answering every request with :meth:`TypoFixer.respond`, an OpenAI-compatible agent that can
fix the typo of examples/agent/project — when it is told how to work:

* Turn 1 decides the run. With probability ``p`` it works: it reads ``wordfreq/__init__.py`` and runs the tests;
  otherwise it answers at once that the package looks fine (the run ends, the ``tests-pass`` verifier fails).
  ``p`` is 0.25, plus 0.5 when the system prompt (the instructions) says "read the file", plus 0.25 when it says
  "run the tests".
* A working run then writes the file it read with the typo fixed (``most_comon`` → ``most_common``), runs the tests
  again if its instructions say "run the tests", and answers in one sentence.

The draws come from one ``random.Random(seed)``, one per run (its first turn), in the order the first turns
arrive: crucible measures one reading after another, so the passes of each reading, and the whole session's
table, are the same on every run of the example.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tests.support.chat_server import Behaviour, ChatServer, call, reply

BASE_P = 0.25
GUIDANCE = {"read the file": 0.5, "run the tests": 0.25}
"""Phrases of the instructions the model follows, and what each adds to its chance of working."""
SEED = 7
TYPO, FIX = "most_comon", "most_common"
PACKAGE = "wordfreq/__init__.py"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _tokens(body: dict[str, Any]) -> int:
    return max(1, len(json.dumps(body)) // 4)


class TypoFixer:
    """The model's policy (module doc); ``draws`` counts the runs it has decided."""

    def __init__(self, seed: int = SEED) -> None:
        self.rng = random.Random(seed)
        self.draws = 0

    @staticmethod
    def chance(instructions: str) -> float:
        """``p``: the chance a run with these instructions works (module doc)."""
        low = " ".join(instructions.lower().split())
        return min(1.0, BASE_P + sum(v for k, v in GUIDANCE.items() if k in low))

    def respond(self, body: dict[str, Any]) -> Behaviour:
        """The answer to one chat-completions request."""
        messages: list[dict[str, Any]] = body.get("messages", [])
        system = " ".join(_text(m) for m in messages if m.get("role") == "system")
        answered = [m for m in messages if m.get("role") == "assistant"]
        usage = (_tokens(body), 40)
        if not answered:
            self.draws += 1
            if self.rng.random() >= self.chance(system):
                return reply("The package looks correct to me; nothing to change.", usage=usage)
            return reply("Let me read the package and run its tests.",
                         [call("read_file", {"path": PACKAGE}, id="call_read"), call("run_tests", {}, id="call_t1")],
                         usage=usage)
        tools = [m for m in messages if m.get("role") == "tool"]
        if len(answered) == 1:
            source = next((_text(m) for m in tools if TYPO in _text(m) and "def " in _text(m)), "")
            if not source:
                return reply("I could not read the package; stopping here.", usage=usage)
            return reply(f"`{TYPO}` is a typo for `{FIX}`. Fixing it.",
                         [call("write_file", {"path": PACKAGE, "content": source.replace(TYPO, FIX)}, id="call_write")],
                         usage=usage)
        if len(answered) == 2 and "run the tests" in " ".join(system.lower().split()):
            return reply("Running the tests again.", [call("run_tests", {}, id="call_t3")], usage=usage)
        return reply(f"Fixed the typo in {PACKAGE}: `{TYPO}` is now `{FIX}`.", usage=usage)


async def serve(seed: int = SEED) -> ChatServer:
    """A started loopback server answering as :class:`TypoFixer` (stop it with ``await server.stop()``)."""
    server = ChatServer(respond=TypoFixer(seed).respond)
    await server.start()
    return server
