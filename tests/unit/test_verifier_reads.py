"""How much of an output a verifier reads (shared/core/verify/verifiers/context.py, shared/proc/verifier.py).

In-memory verifiers (``output_regex``, ``output_json_schema``, ``ctx.output()`` in a python one) read
at most :data:`VERIFIER_READ_MAX_BYTES` whole — a longer output is an ``error`` verdict and is never
read; the ``command`` verifier streams any size into its file and stdin, chunk by chunk.
"""

from __future__ import annotations

import hashlib
import io
import sys
from collections.abc import Iterator
from typing import IO

import pytest

from reel.shared.application.verifierrun import make_verifier, run_verifier
from reel.shared.core.run.events import BlobRef
from reel.shared.core.run.views import AttemptView, EpisodeView, StepView
from reel.shared.core.verify.verifiers import VERIFIER_READ_MAX_BYTES, OutputTooLarge, make_ctx
from reel.shared.core.workflow.spec import VerifierSpec

MIB = 1 << 20


def _blocks(n: int) -> Iterator[bytes]:
    for k in range(n):
        yield bytes([65 + k % 26]) * MIB


class StreamOnly:
    """A blob handle that streams ``n`` MiB for any ref and refuses whole reads; records the largest write."""

    def __init__(self, n: int) -> None:
        self.n, self.gets, self.largest = n, 0, 0

    async def get(self, ref: BlobRef) -> bytes:
        self.gets += 1
        raise AssertionError("an output over the bound must not be read whole")

    async def get_file(self, ref: BlobRef, into: IO[bytes] | None) -> int:
        size = 0
        for b in _blocks(self.n):
            self.largest = max(self.largest, len(b))
            size += len(b)
            if into is not None:
                into.write(b)
        return size


def _view(size: int) -> EpisodeView:
    out = BlobRef(sha256="0" * 64, size_bytes=size)
    step = StepView(step_id="dump", kind="tool", status="succeeded", attempts=(
        AttemptView(step_id="dump", attempt=1, status="succeeded", executor_id="x", dispatched_lsn=2, output_ref=out),))
    return EpisodeView(run_id="r-1", workflow_name="w", branch_id="main", snapshot_lsn=9, status="verifying",
                       lineage=(), steps=(step,))


@pytest.mark.parametrize("spec", [VerifierSpec(type="output_regex", pattern="A"),
                                  VerifierSpec(type="output_json_schema", json_schema={"type": "object"})])
async def test_an_in_memory_verifier_errors_on_an_output_over_its_bound(spec: VerifierSpec) -> None:
    blobs = StreamOnly(0)
    ctx = make_ctx(_view(VERIFIER_READ_MAX_BYTES + 1), step="dump", blobs=blobs, timeout_s=5)
    result = await run_verifier(make_verifier(spec), ctx)
    assert result.status == "error" and blobs.gets == 0
    assert f"is {VERIFIER_READ_MAX_BYTES + 1} bytes, over the {VERIFIER_READ_MAX_BYTES}" in result.reason
    with pytest.raises(OutputTooLarge):
        await ctx.output()


async def test_the_command_verifier_streams_an_output_of_any_size() -> None:
    n = 40  # MiB: over the in-memory bound
    want = hashlib.sha256(b"".join(_blocks(n))).hexdigest()
    check = ("import hashlib, os, sys\n"
             "h = hashlib.sha256()\n"
             "while b := sys.stdin.buffer.read1(1 << 20): h.update(b)\n"
             "f = hashlib.sha256(open(os.environ['REEL_OUTPUT_FILE'], 'rb').read()).hexdigest()\n"
             f"raise SystemExit(0 if h.hexdigest() == f == {want!r} else 1)\n")
    blobs = StreamOnly(n)
    ctx = make_ctx(_view(n * MIB), step="dump", blobs=blobs, timeout_s=60)
    result = await run_verifier(make_verifier(VerifierSpec(type="command", argv=(sys.executable, "-c", check),
                                                           timeout_s=60)), ctx)
    assert result.status == "pass", result
    assert blobs.gets == 0 and blobs.largest == MIB
    into = io.BytesIO()
    assert await ctx.output_to(into) == n * MIB
