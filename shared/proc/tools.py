"""Tool runners for tool steps: recorded, scripted, and real commands.

Each returns the tool's :class:`ToolOutput` or raises :class:`~shared.core.errors.ToolError`.
A command runs on :func:`~shared.proc.group.run_group`: its own process group,
killed as a whole when it exits (background children included), on timeout or
when the attempt is cancelled. If the executor process dies (kill -9), Linux's
parent-death signal kills the tool's direct child, and the next executor started
on the host kills the rest of the group (:func:`reap_orphaned_tools`, i.e.
:func:`shared.proc.orphans.reap_orphans`).
Tool steps run at least once per attempt: a step that must not repeat a side
effect should be idempotent (e.g. keyed by ``REEL_RUN_ID``/``REEL_STEP_ID``).

A command's output (stdout and stderr merged) is never held whole: it streams into a
spool (:class:`ToolOutput`: memory up to :data:`SPOOL_MEMORY_BYTES`, then a temporary
file), hashed (sha256) as it comes, up to the tool's cap
(:func:`shared.core.toolspec.output_limit`; ``REEL_TOOL_MAX_OUTPUT_BYTES``); past the
cap the rest is read and dropped, and the attempt fails ``output_too_large`` or, with
``on_overflow: truncate``, returns the head marked ``truncated``. The executor stores
a spool as a blob chunk by chunk (:meth:`shared.nats.blobstore.JetStreamBlobStore.put_file`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from types import TracebackType
from typing import IO

from shared.core.errors import BlobMissing, BlobTimeout, ToolError
from shared.core.toolenv import spec_env
from shared.core.toolspec import OUTPUT_TOO_LARGE, OutputLimit
from shared.core.workflow import ScriptedFailure, ToolSpec
from shared.proc.group import Stdin, run_group
from shared.proc.orphans import reap_orphans as reap_orphaned_tools

__all__ = ["SPOOL_MEMORY_BYTES", "ToolOutput", "reap_orphaned_tools", "run_tool"]

SPOOL_MEMORY_BYTES = 1024 * 1024
"""An output up to this many bytes stays in memory; a longer one rolls over to a temporary file."""
TAIL_BYTES = 2000
"""The last bytes seen (past the cap too), kept for a failing command's error message."""


class ToolOutput:
    """One attempt's tool output as kept (its head, when truncated), spooled as it arrives.

    Attributes:
        size_bytes: bytes kept (at most the cap); seen_bytes: bytes the tool printed in all.
        truncated: more than ``limit`` bytes came (the spool holds the first ``limit``).
        sha256: hex digest of the kept bytes, computed while spooling.

    Use as a context manager (or :meth:`close`): a spool past :data:`SPOOL_MEMORY_BYTES` is a temp file.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size_bytes = self.seen_bytes = 0
        self._spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115
        self._hash = hashlib.sha256()
        self._tail = b""

    @classmethod
    def of(cls, data: bytes) -> ToolOutput:
        """A spool holding ``data`` (a recorded or scripted tool's output; never truncated)."""
        out = cls(len(data))
        out.write(data)
        return out

    def write(self, chunk: bytes) -> None:
        """Take the next chunk the tool printed: spooled up to the cap, counted past it."""
        self.seen_bytes += len(chunk)
        self._tail = (self._tail + chunk)[-TAIL_BYTES:]
        room = self.limit - self.size_bytes
        if room > 0:
            kept = chunk[:room]
            self._spool.write(kept)
            self._hash.update(kept)
            self.size_bytes += len(kept)

    @property
    def truncated(self) -> bool:
        """True if the tool printed more than its cap."""
        return self.seen_bytes > self.limit

    @property
    def sha256(self) -> str:
        """sha256 hex of the kept bytes."""
        return self._hash.hexdigest()

    def tail_text(self, chars: int = 500) -> str:
        """The last ``chars`` characters the tool printed (past the cap too), decoded with replacement."""
        return self._tail.decode("utf-8", errors="replace")[-chars:]

    def file(self) -> IO[bytes]:
        """The spool, rewound to its start (to stream it into the blob store)."""
        self._spool.seek(0)
        return self._spool

    def read(self) -> bytes:
        """The kept bytes, whole (only for an output known to be small: see :data:`SPOOL_MEMORY_BYTES`)."""
        return self.file().read()

    def close(self) -> None:
        """Drop the spool (its temp file, if it rolled over)."""
        self._spool.close()

    def __enter__(self) -> ToolOutput:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


async def run_tool(spec: ToolSpec, *, attempt: int, stdin: Stdin = None, env: dict[str, str] | None = None,
                   limit: OutputLimit | None = None) -> ToolOutput:
    """Run one attempt (1-based) of a tool step; returns its output (the caller closes it).

    ``stdin``: a command's standard input — bytes, or chunks as they come (``stdin_from``: the earlier
    output streamed from the blob store, checked against its sha256 as it goes; never held whole).
    ``env``: the variables Reel defines for the call (the executor passes ``REEL_RUN_ID``, ``REEL_BRANCH_ID``,
    ``REEL_STEP_ID``, ``REEL_ATTEMPT``); the command's environment is the allow-list of
    :mod:`shared.core.toolenv` (this process's ``PATH``, ``HOME``…, the spec's ``pass_env`` and ``env``)
    plus these — never this process's whole environment. ``limit``: the
    command's output cap and overflow policy (the tool's own, resolved by
    :func:`shared.core.toolspec.output_limit`; default 8 MiB, ``fail``).

    Raises:
        ToolError: scripted failure (its kind), ``exit_<code>`` for a command that exited non-zero,
            ``timeout`` past ``spec.timeout_s``, ``spawn_failed``, ``output_too_large`` (retryable) for
            a command that printed more than ``limit.max_bytes`` with ``on_overflow: fail``;
            ``stdin_blob_corrupt`` / ``stdin_blob_missing`` (not retryable) or ``stdin_blob_timeout``
            (retryable) when the ``stdin`` source could not be read whole and checked — the command is
            killed then, even if it had exited 0 (it may have acted on bytes that were not the body).
    """
    if spec.type == "recorded":
        return ToolOutput.of((spec.output or "").encode())
    if spec.type == "scripted":
        entry = spec.outputs[min(attempt, len(spec.outputs)) - 1]
        if isinstance(entry, ScriptedFailure):
            raise ToolError(entry.message or entry.error, kind=entry.error, retryable=entry.retryable)
        return ToolOutput.of(entry.encode())
    out = ToolOutput((limit or OutputLimit()).max_bytes)
    try:
        await _run_command(spec, out, limit or OutputLimit(), stdin, env)
    except BaseException:
        out.close()
        raise
    return out


async def _run_command(spec: ToolSpec, out: ToolOutput, limit: OutputLimit, stdin: Stdin,
                       env: dict[str, str] | None) -> None:
    """Run ``spec.argv`` (stderr merged into stdout, streamed into ``out``) on :func:`run_group`."""
    try:
        done = await run_group(spec.argv, timeout_s=spec.timeout_s, env=spec_env(os.environ, spec, env or {}),
                               stdin=stdin or b"", output_limit_bytes=limit.max_bytes, merge_stderr=True,
                               stdout_sink=out.write)
    except OSError as exc:
        raise ToolError(f"cannot run {spec.argv[0]!r}: {exc.strerror}", kind="spawn_failed", retryable=False) from exc
    except (BlobMissing, BlobTimeout) as exc:  # the stdin source (BlobCorrupt is a BlobMissing)
        raise ToolError(f"{spec.argv[0]}: its stdin_from input could not be read and checked whole "
                        f"(the command was killed): {exc.message}", kind=f"stdin_{exc.code}",
                        retryable=exc.retryable) from exc
    if done.timed_out:
        raise ToolError(f"{spec.argv[0]} timed out after {spec.timeout_s}s", kind="timeout")
    if done.returncode != 0:
        raise ToolError(f"{spec.argv[0]} exited {done.returncode}: {out.tail_text()}", kind=f"exit_{done.returncode}")
    if out.truncated and limit.on_overflow == "fail":
        raise ToolError(f"{spec.argv[0]} printed {out.seen_bytes} bytes, over its max_output_bytes "
                        f"{limit.max_bytes} (on_overflow: fail; set on_overflow: truncate to keep the head)",
                        kind=OUTPUT_TOO_LARGE)
