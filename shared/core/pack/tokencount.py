"""Token counting: a pluggable counter that needs no download at run time.

:class:`HeuristicCounter` counts word pieces and punctuation with one regex and
splits long words the way BPE tokenizers do (about one token per 6 letters). On
the trajectories in ../shared/data it gives 3.3–3.8 characters per token, the
usual range for English and code; it is not any model's exact tokenizer. A
packing budget needs a stable, monotone estimate; plug a real tokenizer in
through :class:`TokenCounter` where exact counts matter.
"""

from __future__ import annotations

import re
from typing import Protocol

_WORDS = re.compile(r"[A-Za-z]+")
_DIGITS = re.compile(r"\d+")
_OTHER = re.compile(r"[^\sA-Za-z\d]")


class TokenCounter(Protocol):
    """Counts tokens in a text."""

    name: str

    def count(self, text: str) -> int: ...


class HeuristicCounter:
    """Regex word-piece estimate: one token per punctuation mark or ≤ 3 digits, ~1 per 6 letters."""

    name = "heuristic-v1"

    def count(self, text: str) -> int:
        """Estimated tokens in ``text`` (0 for the empty string).

        A run of letters counts ``1 + (len - 1) // 6``, a run of digits one per
        3 digits, every other non-space character one.
        """
        words = _WORDS.findall(text)
        n = len(words) + sum((len(w) - 1) // 6 for w in words if len(w) > 6)
        n += sum((len(d) + 2) // 3 for d in _DIGITS.findall(text))
        return n + len(_OTHER.findall(text))


DEFAULT_COUNTER: TokenCounter = HeuristicCounter()
