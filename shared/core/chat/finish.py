"""Finish reasons: what a server said about how its answer ended, and when that answer is not a final one.

A finish reason is recorded with every model attempt exactly as the server sent it
(``stop``, ``length``, ``tool_calls``, ``content_filter``, any other string as-is; ``None``
when it sent none). ``length`` (the answer hit ``max_tokens``) and ``content_filter`` (the
provider stopped it) mean the answer was cut: it is never taken as a final answer
silently. The step's ``on_truncated`` (docs/workflow.md) says what happens instead:

* ``fail`` (the default): the attempt fails, ``truncated``, not retryable — the step
  (an agent step: the agent) fails with :func:`truncation_message`;
* ``retry``: the attempt fails, ``truncated``, retryable — the next attempt (up to the
  step's ``max_attempts``) asks again;
* ``continue``: the cut answer is taken as it is, recorded ``truncated: true`` beside its
  finish reason (a verifier sees both), and the step goes on as with any answer.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

OnTruncated = Literal["fail", "continue", "retry"]
TRUNCATED = "truncated"
"""Error kind of an attempt whose answer was cut (``on_truncated`` ``fail`` or ``retry``)."""
TRUNCATING: frozenset[str] = frozenset({"length", "content_filter"})
"""Finish reasons that say the answer was cut."""

_WHY = {
    "length": "the model's answer was cut at max_tokens (finish_reason length)",
    "content_filter": "the model's answer was stopped by the provider's content filter (finish_reason content_filter)",
}


def is_truncated(finish_reason: str | None) -> bool:
    """True when ``finish_reason`` says the answer was cut (``length``, ``content_filter``)."""
    return finish_reason in TRUNCATING


def truncation_message(finish_reason: str) -> str:
    """The one-line reason a cut answer's attempt fails with, e.g. "the model's answer was cut at max_tokens
    (finish_reason length)"."""
    return _WHY.get(finish_reason, f"the model's answer was cut (finish_reason {finish_reason})")
