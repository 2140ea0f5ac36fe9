"""Crucible's pure core: state model, typed iteration, session events, fold, noise, budgets.

No I/O here: the shell (services/crucible) runs the world, the judge and the
proposer, commits events to the session log and folds them with :func:`fold.apply`.
"""

from reel.shared.crucible.config import SessionConfig, parse_config
from reel.shared.crucible.events import AnySessionEvent, SessionCommit
from reel.shared.crucible.fold import SessionState, fold
from reel.shared.crucible.iteration import Applied, CandidateChange, Decided, Iteration, Measured, Proposed
from reel.shared.crucible.state import (
    EXIT_CODES,
    Fate,
    InvalidReading,
    LoopExit,
    Measurement,
    Reading,
    Row,
    Run,
    Segment,
    SessionOutcome,
    WorldSha,
)

__all__ = [
    "EXIT_CODES",
    "AnySessionEvent",
    "Applied",
    "CandidateChange",
    "Decided",
    "Fate",
    "InvalidReading",
    "Iteration",
    "LoopExit",
    "Measured",
    "Measurement",
    "Proposed",
    "Reading",
    "Row",
    "Run",
    "Segment",
    "SessionCommit",
    "SessionConfig",
    "SessionOutcome",
    "SessionState",
    "WorldSha",
    "fold",
    "parse_config",
]
