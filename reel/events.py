"""The typed events of a run's log, as ``RunHandle.events()`` yields them inside each ``CommitEvent``.

Each is a frozen ``msgspec.Struct`` tagged by ``type`` (its JSON name, e.g. ``attempt_succeeded``); ``Event`` is
the union of them all. Fields, units and meaning: docs/subjects.md ("Commits") and docs/architecture.md.
Match on them::

    async for commit in handle.events():
        for event in commit.events:
            match event:
                case reel.events.AttemptFailed(step_id=step, error_kind=kind):
                    print(commit.lsn, step, kind)
"""

from __future__ import annotations

from reel.shared.core.input.requestevents import InputAnswered as InputAnswered
from reel.shared.core.input.requestevents import InputRequested as InputRequested
from reel.shared.core.input.requestevents import RunAwaitingInput as RunAwaitingInput
from reel.shared.core.run.eventfields import BlobRef as BlobRef
from reel.shared.core.run.eventfields import ContextPartition as ContextPartition
from reel.shared.core.run.events import AgentFinished as AgentFinished
from reel.shared.core.run.events import AnyEvent
from reel.shared.core.run.events import AttemptCancelled as AttemptCancelled
from reel.shared.core.run.events import AttemptDispatched as AttemptDispatched
from reel.shared.core.run.events import AttemptFailed as AttemptFailed
from reel.shared.core.run.events import AttemptSucceeded as AttemptSucceeded
from reel.shared.core.run.events import BranchForked as BranchForked
from reel.shared.core.run.events import RunCancelled as RunCancelled
from reel.shared.core.run.events import RunCompleted as RunCompleted
from reel.shared.core.run.events import RunCreated as RunCreated
from reel.shared.core.run.events import RunStarted as RunStarted
from reel.shared.core.run.events import RunVerifying as RunVerifying
from reel.shared.core.run.events import StepsDeclared as StepsDeclared
from reel.shared.core.run.events import VerdictRecorded as VerdictRecorded

Event = AnyEvent
"""Any event of a run's log (the union of the classes above)."""

__all__ = ["AgentFinished", "AttemptCancelled", "AttemptDispatched", "AttemptFailed", "AttemptSucceeded", "BlobRef",
           "BranchForked", "ContextPartition", "Event", "InputAnswered", "InputRequested", "RunAwaitingInput",
           "RunCancelled", "RunCompleted", "RunCreated", "RunStarted", "RunVerifying", "StepsDeclared",
           "VerdictRecorded"]
