"""The ``replay`` adapter: plays what a real trajectory recorded.

``output`` (one recorded answer, text) serves a ``kind: model`` step (one turn);
``turns`` (recorded assistant messages, tool calls included, with their usage) serve
an agent step turn by turn, exactly as the scripted adapter plays them.
"""

from __future__ import annotations

from reel.shared.core.chat.messages import ChatRequest, ChatResponse
from reel.shared.core.pack.tokencount import DEFAULT_COUNTER, TokenCounter
from reel.shared.core.workflow.modelspec import ModelSpec, ScriptedTurn
from reel.shared.models.scripted import play_turn, scripted_turn


class ReplayAdapter:
    """Plays a recorded output; reports recorded usage when the recording has it."""

    name = "replay"

    def __init__(self, spec: ModelSpec, counter: TokenCounter = DEFAULT_COUNTER) -> None:
        if spec.output is None and not spec.scripted_turns:
            raise ValueError("replay adapter needs a recorded output")
        self._spec, self._output, self._counter = spec, spec.output or "", counter

    async def complete_chat(self, request: ChatRequest) -> ChatResponse:
        """Turn *t* plays ``turns[t-1]``; without ``turns``, the recorded ``output`` as text."""
        if self._spec.scripted_turns:
            turn = scripted_turn(self._spec, request.turn)
        else:
            turn = ScriptedTurn(text=self._output, usage=self._spec.usage)
        return play_turn(self._spec, turn, request, self._counter)
