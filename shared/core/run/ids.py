"""Identifiers of Reel.

All ids are plain strings (``NewType``) that are safe as a single NATS subject
token: ASCII letters, digits, ``-`` and ``_`` only (no ``.``, ``*``, ``>`` or
whitespace), so ``reel.ev.<run_id>`` is always one token per id.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import NewType

RunId = NewType("RunId", str)
StepId = NewType("StepId", str)
BranchId = NewType("BranchId", str)
ContextItemId = NewType("ContextItemId", str)
CommitId = NewType("CommitId", str)
ExecutorId = NewType("ExecutorId", str)
AttemptNo = NewType("AttemptNo", int)  # 1-based
LSN = NewType("LSN", int)  # the JetStream stream sequence of a commit message
RequestId = NewType("RequestId", str)  # an input request (reel.shared.core.input.requestevents)

ROOT_BRANCH = BranchId("main")

def new_run_id() -> RunId:
    """A fresh random run id (``r-`` + 20 hex chars)."""
    return RunId("r-" + uuid.uuid4().hex[:20])


def run_id_for_key(idempotency_key: str) -> RunId:
    """The run id a start command with this idempotency key always maps to.

    Deriving the id from the key is what makes a repeated start return the same
    run: the second creation hits the ``Nats-Expected-Last-Subject-Sequence: 0``
    fence of the first.
    """
    return RunId("r-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:20])


def branch_id_for_key(run_id: str, key: str) -> BranchId:
    """Deterministic branch id for a rewind command's idempotency key."""
    return BranchId("b-" + hashlib.sha256(f"{run_id}\0{key}".encode()).hexdigest()[:12])


def request_id_for(run_id: str, branch_id: str, step_id: str) -> RequestId:
    """The id of the input request of the tool call ``step_id`` declared on ``branch_id`` (``q-`` + 12 hex).

    A pure function of the log, so a refold or a recovery sees the same id; unique within the run
    (one request per call and branch; a fork that keeps the call keeps its request and its id).
    """
    return RequestId("q-" + hashlib.sha256(f"{run_id}\0{branch_id}\0{step_id}".encode()).hexdigest()[:12])


def new_commit_id() -> CommitId:
    """A fresh commit id, used as ``Nats-Msg-Id`` for publish deduplication."""
    return CommitId(uuid.uuid4().hex)


def new_executor_id() -> ExecutorId:
    """A fresh id for one executor process instance."""
    return ExecutorId("x-" + uuid.uuid4().hex[:12])
