"""A command's stdin streamed from an async source (shared/proc/group.py, a ``stdin_from`` blob's chunks).

The source is asked for its next chunk only once the pipe drained (the child's progress lines
prove how far behind it is); a child that stops reading still lets the source run to its end (a
blob checks its sha256 there); a source that fails kills the group before the child sees an EOF.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reel.shared.core.errors import BlobCorrupt, ToolError
from reel.shared.core.workflow.spec import ToolSpec
from reel.shared.proc.group import run_group
from reel.shared.proc.tools import CallId, run_tool

CALL = CallId("r-1", "main", "s", 1)

PY = sys.executable
MIB = 1 << 20

# Reads stdin 1 MiB at a time, printing the running total after each read; the sha256 and total at EOF.
COUNTER = ("import hashlib, sys\n"
           "h, n = hashlib.sha256(), 0\n"
           "while b := sys.stdin.buffer.read1(1 << 20):\n"
           "    h.update(b); n += len(b); print('read', n, flush=True)\n"
           "print('eof', n, h.hexdigest(), flush=True)\n")


def _block(k: int) -> bytes:
    return bytes([k % 251]) * MIB


async def test_the_source_is_read_only_as_fast_as_the_child_reads() -> None:
    n_chunks = 64
    seen = {"read": 0}
    lead = []  # bytes yielded minus bytes the child has said it read, at each yield
    partial = bytearray()  # a stdout chunk may end mid-line: only whole lines are parsed

    def progress(chunk: bytes) -> None:
        partial.extend(chunk)
        *lines, rest = partial.split(b"\n")
        partial[:] = rest
        for line in lines:
            if line.startswith(b"read "):
                seen["read"] = max(seen["read"], int(line.split()[1]))

    async def source() -> AsyncIterator[bytes]:
        for k in range(n_chunks):
            lead.append(k * MIB - seen["read"])
            yield _block(k)

    done = await run_group([PY, "-c", COUNTER], timeout_s=120, stdin=source(), stdout_sink=progress)
    assert done.returncode == 0
    assert seen["read"] == n_chunks * MIB
    assert len(lead) == n_chunks and max(lead) <= 8 * MIB, f"the source ran ahead of the child by {max(lead)} bytes"


async def test_a_child_that_stops_reading_still_lets_the_source_finish() -> None:
    finished = []

    async def source() -> AsyncIterator[bytes]:
        for k in range(32):
            yield _block(k)
        finished.append(True)  # where a blob's sha256 is checked

    done = await run_group([PY, "-c", "import sys; print(len(sys.stdin.buffer.read(10)))"], timeout_s=60,
                           stdin=source())
    assert (done.returncode, done.text(), finished) == (0, "10\n", [True])


async def test_a_failing_source_kills_the_child_before_it_sees_an_eof(tmp_path: Path) -> None:
    marker = tmp_path / "saw-eof"
    script = f"import sys, pathlib; sys.stdin.buffer.read(); pathlib.Path({str(marker)!r}).write_text('eof')"

    async def source() -> AsyncIterator[bytes]:
        yield b"x" * MIB
        raise BlobCorrupt("blob abc… is corrupt: the object holds 1 bytes hashing to def…")

    spec = ToolSpec(type="command", argv=(PY, "-c", script), timeout_s=60)
    with pytest.raises(ToolError) as info:
        await run_tool(spec, CALL, stdin=source())
    assert info.value.kind == "stdin_blob_corrupt" and not info.value.retryable
    assert "could not be read and checked whole (the command was killed)" in info.value.message
    assert "is corrupt" in info.value.message
    assert not marker.exists(), "the child saw an EOF: it could have acted on an unchecked body"


async def test_a_streamed_stdin_reaches_the_tool_byte_for_byte() -> None:
    blocks = [_block(k)[: MIB - k] for k in range(5)]  # uneven chunks

    async def source() -> AsyncIterator[bytes]:
        for b in blocks:
            yield b

    spec = ToolSpec(type="command", argv=(PY, "-c", COUNTER), timeout_s=60)
    with await run_tool(spec, CALL, stdin=source()) as out:
        last = out.read().decode().splitlines()[-1]
    body = b"".join(blocks)
    assert last == f"eof {len(body)} {hashlib.sha256(body).hexdigest()}"
