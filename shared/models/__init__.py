"""Model adapters: the one port model steps and agent turns call (docs/models.md).

Shipped adapters: ``replay`` (recorded outputs or turns), ``scripted`` (answers written in
the workflow, tool calls included), ``openai`` (any OpenAI-compatible chat-completions
endpoint); or your own by ``module:factory``.
"""

from __future__ import annotations

from reel.shared.models.base import ChatModel as ChatModel
from reel.shared.models.loader import make_chat_model as make_chat_model
from reel.shared.models.replay import ReplayAdapter as ReplayAdapter
from reel.shared.models.scripted import ScriptedAdapter as ScriptedAdapter
