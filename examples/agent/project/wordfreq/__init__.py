"""Word frequencies of a text — the tiny package the agent example (examples/agent) fixes.

It ships with a typo that its unit test catches; the agent fixes it in a scratch
copy, never here.
"""

from collections import Counter

PUNCTUATION = ".,;:!?\"'()"


def words(text: str) -> list[str]:
    """The words of ``text``, lower-cased, with surrounding punctuation stripped."""
    return [w.strip(PUNCTUATION).lower() for w in text.split() if w.strip(PUNCTUATION)]


def top_words(text: str, n: int = 3) -> list[tuple[str, int]]:
    """The ``n`` most frequent words of ``text`` with their counts, most frequent first."""
    return Counter(words(text)).most_comon(n)
