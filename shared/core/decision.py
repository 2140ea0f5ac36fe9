"""The one decision type of every mutator: the events to commit, or why there is nothing to do.

A pure decide function (``cancel.decide``, ``rewind.decide``, ``respond.decide``,
``recovery.decide``, the executor's and the verifier's) returns a :data:`Decision`:

* a non-empty ``tuple`` of events — commit them, in order, as one commit;
* :class:`Skip` — commit nothing; ``reason`` says why (logged, and put in replies).

An empty tuple is never a decision: :func:`events_or_skip` turns "no events" into a ``Skip``.
:func:`reel.shared.application.fenced.commit_decided` takes a ``decide(state) -> Decision`` and hands back the state
decided on, the decision and the commit (docs/mutators.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from reel.shared.core.run.events import AnyEvent


class Skip(msgspec.Struct, frozen=True):
    """Nothing to commit; ``reason`` (one short phrase, e.g. ``"run is already completed"``) says why."""

    reason: str


Decision = tuple[AnyEvent, ...] | Skip
"""What a decide function returns: the events of one commit (never empty), or :class:`Skip`."""


def events_or_skip(events: Iterable[AnyEvent], reason: str) -> Decision:
    """``events`` as a decision, or ``Skip(reason)`` when there are none."""
    out = tuple(events)
    return out if out else Skip(reason)
