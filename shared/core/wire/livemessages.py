"""What Reel sends on core NATS while a run is live — never stored, never the source of truth.

Two kinds of messages, both JSON (schemas in docs/schemas/, subjects in docs/subjects.md):

* :class:`RunControl` on ``<ns>.ctl.<run_id>`` — published by a mutator *after* its commit, so the
  executor driving the run learns of it at once instead of at its next fenced commit. Losing
  one costs only promptness: the log says the same thing (the executor reads it again when
  its connection comes back), and every commit the executor makes is decided on the log.
* :class:`StreamChunk` on ``<ns>.stream.<run_id>.<branch>.<step>.<attempt>`` — the deltas of one
  model attempt whose model spec sets ``stream: true``, in order (``seq`` 0, 1, …), the last
  one with ``done``. The log keeps only the consolidated response (the attempt's output
  blob): a consumer that joins late reads that.

Pure types; no I/O.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from reel.shared.core.run.ids import LSN, RunId

ControlSignal = Literal["cancelled"]


class RunControl(msgspec.Struct, frozen=True, kw_only=True):
    """A signal to the executor driving ``run_id``: ``cancelled`` — the run's ``run_cancelled`` is committed at ``lsn``.

    The executor stops the attempts it has in flight (process group killed, task cancelled,
    HTTP call aborted) and records them ``attempt_cancelled``.
    """

    run_id: RunId
    signal: ControlSignal
    lsn: LSN


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A fragment of the tool call at ``index`` of the response (``id`` and ``name`` come once, first)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


class ToolProgress(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A tool call's progress as its MCP server reported it (``notifications/progress``): ``progress`` so far,
    of ``total`` when the server knows it, and its ``message``."""

    progress: float
    total: float | None = None
    message: str = ""


class StreamChunk(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of an attempt's stream.

    Attributes:
        seq: 0-based position in the attempt's stream (a subscriber sees them in order on one connection).
        content: a fragment of the assistant text.
        tool_calls: fragments of tool calls; concatenating each index's ``arguments`` gives the call's.
        progress: an MCP tool call's progress (on the call attempt's subject; not stored).
        done: the last message of the attempt: ``finish_reason`` when the response is complete, else
            ``error`` (the stream broke, the call failed, or the attempt was interrupted) — a failed
            attempt is retried as a new attempt, on its own subject.
    """

    seq: int
    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    progress: ToolProgress | None = None
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None


_control = msgspec.json.Decoder(RunControl)
_chunk = msgspec.json.Decoder(StreamChunk)


def encode_live(msg: RunControl | StreamChunk) -> bytes:
    """JSON bytes of a control message or a stream chunk."""
    return msgspec.json.encode(msg)


def decode_control(data: bytes) -> RunControl:
    """A :class:`RunControl` from JSON. Raises msgspec.ValidationError / msgspec.DecodeError."""
    return _control.decode(data)


def decode_chunk(data: bytes) -> StreamChunk:
    """A :class:`StreamChunk` from JSON. Raises msgspec.ValidationError / msgspec.DecodeError."""
    return _chunk.decode(data)
