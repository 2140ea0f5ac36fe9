"""The one command runner of every tool — a tool step's ``command`` and an agent's command tool
(:func:`run_command`) — and the tool step's recorded and scripted tools (:func:`run_tool`).

One call identity (:class:`CallId`: the ``REEL_*`` variables every tool call gets, its idempotency key), one
environment policy (:func:`reel.shared.core.env.toolenv.spec_env`, applied in :func:`run_command`), one
output-limit policy (the tool's ``max_output_bytes``/``on_overflow``, else its caller's default:
docs/workflow.md "Tool output limits"), one error vocabulary (:func:`run_command`'s ``Raises``).

Each returns the tool's :class:`ToolOutput` or raises :class:`~reel.shared.core.errors.ToolError`.
A command runs on :func:`~reel.shared.proc.group.run_group`: its own process group,
killed as a whole when it exits (background children included), on timeout or
when the attempt is cancelled. If the executor process dies (kill -9), Linux's
parent-death signal kills the tool's direct child, and the next executor started
on the host kills the rest of the group (:func:`reap_orphaned_tools`, i.e.
:func:`reel.shared.proc.reaper.reap_orphans`).
Tool steps run at least once per attempt: a step that must not repeat a side
effect should be idempotent (e.g. keyed by ``REEL_IDEMPOTENCY_KEY``: :attr:`CallId.key`).

A command's output (stdout and stderr merged) is never held whole: it streams into a
spool (:class:`ToolOutput`: memory up to :data:`SPOOL_MEMORY_BYTES`, then a temporary
file), hashed (sha256) as it comes, up to the tool's cap
(:func:`reel.shared.core.workflow.toolspec.output_limit`; ``REEL_TOOL_MAX_OUTPUT_BYTES``); past the
cap the rest is read and dropped, and the attempt fails ``output_too_large`` or, with
``on_overflow: truncate``, returns the head marked ``truncated``. The executor stores
a spool as a blob chunk by chunk (:meth:`reel.shared.nats.blobstore.JetStreamBlobStore.put_file`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from reel.shared.auth import secrets
from reel.shared.core.env.redact import StreamScrubber
from reel.shared.core.env.toolenv import EnvDeclared, spec_env
from reel.shared.core.errors import BlobMissing, BlobTimeout, ToolError
from reel.shared.core.workflow.spec import ScriptedFailure, ToolSpec
from reel.shared.core.workflow.toolspec import OUTPUT_TOO_LARGE, OutputLimit
from reel.shared.proc.group import Stdin, run_group
from reel.shared.proc.reaper import reap_orphans as reap_orphaned_tools

__all__ = ["SPOOL_MEMORY_BYTES", "CallId", "Command", "ToolOutput", "reap_orphaned_tools", "run_command", "run_tool"]

SPOOL_MEMORY_BYTES = 1024 * 1024
"""An output up to this many bytes stays in memory; a longer one rolls over to a temporary file."""
TAIL_BYTES = 4000
"""The last bytes seen (past the cap too), kept for a failing command's error message."""


class ToolOutput:
    """One attempt's tool output as kept (its head, when truncated), spooled as it arrives — with a
    ``scrubber``, the values of this process's secrets replaced by ``[redacted:NAME]`` first
    (:class:`~reel.shared.core.env.redact.StreamScrubber`; the cap counts the scrubbed bytes; call :meth:`finish`
    at the end of the output).

    Attributes:
        size_bytes: bytes kept (at most the cap); seen_bytes: bytes the tool printed in all.
        truncated: more than ``limit`` bytes came (the spool holds the first ``limit``).
        sha256: hex digest of the kept bytes, computed while spooling.

    Use as a context manager (or :meth:`close`): a spool past :data:`SPOOL_MEMORY_BYTES` is a temp file.
    """

    def __init__(self, limit: int, scrubber: StreamScrubber | None = None) -> None:
        self.limit = limit
        self.size_bytes = self.seen_bytes = 0
        self._offered = 0  # bytes after scrubbing (what the cap applies to)
        self._scrubber = scrubber
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
        """Take the next chunk the tool printed: scrubbed of this process's secrets (with a ``scrubber``; a value
        split across chunks too), spooled up to the cap, counted past it."""
        self.seen_bytes += len(chunk)
        self._keep(chunk if self._scrubber is None else self._scrubber.feed(chunk))

    def finish(self) -> None:
        """The tool's output ended: keep what the scrubber held back (a possible start of a secret)."""
        if self._scrubber is not None:
            self._keep(self._scrubber.end())

    def _keep(self, chunk: bytes) -> None:
        self._offered += len(chunk)
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
        return self._offered > self.limit

    @property
    def sha256(self) -> str:
        """sha256 hex of the kept bytes."""
        return self._hash.hexdigest()

    def tail_text(self, chars: int = TAIL_BYTES) -> str:
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


@dataclass(frozen=True)
class CallId:
    """One attempt of one tool call — a tool step's, or an agent's call step ``<agent>:t<turn>:c<i>`` — as its
    tool is told it.

    Attributes:
        run_id, branch_id, step_id: the step the call is; attempt: 1-based; tool: the tool's name (a tool
            step's ``name``, else its step id).
    """

    run_id: str
    branch_id: str
    step_id: str
    attempt: int
    tool: str = ""

    @property
    def key(self) -> str:
        """The call's idempotency key, ``<run>/<branch>/<step>``: the same for every attempt of the call, so an
        outside service can dedupe a retry."""
        return f"{self.run_id}/{self.branch_id}/{self.step_id}"

    def env(self, **extra: str) -> dict[str, str]:
        """The variables Reel defines for the call (a command's environment): ``REEL_RUN_ID``, ``REEL_BRANCH_ID``,
        ``REEL_STEP_ID``, ``REEL_ATTEMPT``, ``REEL_IDEMPOTENCY_KEY``, ``REEL_TOOL_NAME``, and ``extra`` (an agent
        tool's ``REEL_TOOL_ARGS``)."""
        return {"REEL_RUN_ID": self.run_id, "REEL_BRANCH_ID": self.branch_id, "REEL_STEP_ID": self.step_id,
                "REEL_ATTEMPT": str(self.attempt), "REEL_IDEMPOTENCY_KEY": self.key,
                "REEL_TOOL_NAME": self.tool or self.step_id, **extra}


@dataclass(frozen=True)
class Command:
    """One command call of a tool — a tool step's (:class:`ToolSpec`) or an agent's command tool
    (:class:`~reel.shared.core.workflow.agentspec.AgentToolSpec`) — as :func:`run_command` runs it.

    Attributes:
        argv: the program and its arguments (no shell).
        name: what messages call it (the tool's name, else ``argv[0]``).
        timeout_s: deadline from the spawn (s).
        spec: the tool's spec, whose ``env``/``pass_env`` :func:`~reel.shared.core.env.toolenv.spec_env` applies.
        reel: the variables Reel defines for the call (``REEL_RUN_ID``, ``REEL_ATTEMPT``…).
        limit: the output cap and overflow policy (the tool's own, resolved by
            :func:`reel.shared.core.workflow.toolspec.output_limit` against its caller's default).
    """

    argv: tuple[str, ...]
    name: str
    timeout_s: float
    spec: EnvDeclared
    reel: Mapping[str, str] = field(default_factory=dict)
    limit: OutputLimit = field(default_factory=OutputLimit)


async def run_tool(spec: ToolSpec, call: CallId, *, stdin: Stdin = None, limit: OutputLimit | None = None,
                   workspace: str | Path | None = None) -> ToolOutput:
    """Run attempt ``call.attempt`` (1-based) of a tool step; returns its output (the caller closes it).

    ``stdin``: a command's standard input — bytes, or chunks as they come (``stdin_from``: the earlier
    output streamed from the blob store, checked against its sha256 as it goes; never held whole).
    ``call``: who the call is (its variables: :meth:`CallId.env`). ``limit``: the command's output cap and
    overflow policy (default: :class:`OutputLimit`'s, a tool step's). ``workspace``: the branch's working copy,
    a command's ``$REEL_WORKSPACE`` (docs/workspaces.md). A ``command`` runs on :func:`run_command`.

    Raises:
        ToolError: scripted failure (its kind), or one of :func:`run_command`'s.
    """
    if spec.type == "recorded":
        return ToolOutput.of((spec.output or "").encode())
    if spec.type == "scripted":
        entry = spec.outputs[min(call.attempt, len(spec.outputs)) - 1]
        if isinstance(entry, ScriptedFailure):
            raise ToolError(entry.message or entry.error, kind=entry.error, retryable=entry.retryable)
        return ToolOutput.of(entry.encode())
    return await run_command(Command(argv=spec.argv, name=spec.name or spec.argv[0], timeout_s=spec.timeout_s,
                                     spec=spec, reel=call.env(**({} if workspace is None else
                                                                 {"REEL_WORKSPACE": str(workspace)})),
                                     limit=limit or OutputLimit()), stdin=stdin)


async def run_command(cmd: Command, *, stdin: Stdin = None) -> ToolOutput:
    """Run ``cmd`` (stderr merged into stdout, streamed into the returned spool; the caller closes it) on
    :func:`run_group`, with the environment of :func:`~reel.shared.core.env.toolenv.spec_env` — the one place a
    tool's command gets its environment.

    Raises:
        ToolError: ``exit_<N>`` (the message ends with the output's last :data:`TAIL_BYTES`), ``timeout``,
            ``spawn_failed``, ``output_too_large`` (past ``limit.max_bytes``, ``on_overflow: fail``),
            ``stdin_blob_corrupt`` / ``_missing`` / ``_timeout`` — the one table of every tool's error kinds,
            with when each occurs and whether it is retried, is docs/workflow.md "Tool errors".
    """
    out = ToolOutput(cmd.limit.max_bytes, secrets.stream())
    try:
        await _run(cmd, out, stdin)
    except BaseException:
        out.close()
        raise
    return out


async def _run(cmd: Command, out: ToolOutput, stdin: Stdin) -> None:
    env = spec_env(os.environ, cmd.spec, cmd.reel)
    try:
        done = await run_group(cmd.argv, timeout_s=cmd.timeout_s, env=env, stdin=stdin or b"",
                               output_limit_bytes=cmd.limit.max_bytes, merge_stderr=True, stdout_sink=out.write)
    except OSError as exc:
        raise ToolError(f"cannot run {cmd.argv[0]!r}: {exc.strerror}", kind="spawn_failed", retryable=False) from exc
    except (BlobMissing, BlobTimeout) as exc:  # the stdin source (BlobCorrupt is a BlobMissing)
        raise ToolError(f"{cmd.name}: its stdin_from input could not be read and checked whole "
                        f"(the command was killed): {exc.message}", kind=f"stdin_{exc.code}",
                        retryable=exc.retryable) from exc
    out.finish()
    if done.timed_out:
        said = out.tail_text()
        raise ToolError(f"{cmd.name} timed out after {cmd.timeout_s:g} s" + (f"; output: {said}" if said else ""),
                        kind="timeout")
    if done.returncode != 0:
        raise ToolError(f"{cmd.name} exited {done.returncode}: {out.tail_text()}", kind=f"exit_{done.returncode}")
    if out.truncated and cmd.limit.on_overflow == "fail":
        raise ToolError(f"{cmd.name} printed {out.seen_bytes} bytes, over its max_output_bytes "
                        f"{cmd.limit.max_bytes} (on_overflow: fail; set on_overflow: truncate to keep the head)",
                        kind=OUTPUT_TOO_LARGE)
