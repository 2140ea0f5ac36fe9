"""The ``command`` verifier: argv with the judged output on stdin and in ``$REEL_OUTPUT_FILE``; exit 0 passes.

The output is streamed from the blob store into a temporary file chunk by chunk (checked against its
sha256; :meth:`~reel.shared.core.verify.verifiers.context.VerifierCtx.output_to`), and that file is the
command's stdin too: the verifier service never holds an output whole, whatever its size.

It runs on :func:`~reel.shared.proc.group.run_group`: its own process group, which dies
with the verifier service and is killed whole when the command exits, at its
timeout, or when :func:`~reel.shared.application.verifierrun.run_verifier` cancels it at the ctx deadline.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import msgspec

from reel.shared.application import workspace
from reel.shared.core.env.toolenv import spec_env
from reel.shared.core.verify.verifiers.builtin import no_output
from reel.shared.core.verify.verifiers.context import VerdictResult, VerifierCtx, errored, failed, passed
from reel.shared.core.workflow.spec import VerifierSpec
from reel.shared.proc.group import run_group

KILL_MARGIN_S = 0.25  # a command verifier is killed this long before its deadline
OUTPUT_FILE_ENV = "REEL_OUTPUT_FILE"
OUTPUT_TAIL_BYTES = 1 << 20  # of the command's output, the last MiB is kept (its last line is quoted)


class CommandVerifier:
    """Runs ``argv`` with the output on stdin and in ``$REEL_OUTPUT_FILE``; exit 0 passes.

    Its environment is the allow-list of :mod:`reel.shared.core.env.toolenv` (the service's ``PATH``, ``HOME``…,
    the spec's ``pass_env`` and ``env``) plus ``REEL_OUTPUT_FILE``, ``REEL_RUN_ID``, ``REEL_BRANCH_ID``,
    ``REEL_STEP_ID``, ``REEL_ATTEMPT`` and ``REEL_SNAPSHOT_LSN`` — never the service's NATS credentials.
    It runs in its own process group, killed whole at ``timeout_s`` (or the ctx deadline, whichever is
    first) → ``error``.
    The reason quotes the exit code and the last line of its output (stdout and stderr).
    """

    def __init__(self, spec: VerifierSpec) -> None:
        self.name, self.version = spec.label, spec.version
        self._spec, self._argv, self._timeout_s = spec, spec.argv, spec.timeout_s

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        """Run the command on the step's output: ``passed`` on exit 0, ``failed`` on another exit status,
        ``error`` when it cannot start or outlives its budget (``timeout_s`` or the ctx deadline, s).
        No output recorded: ``failed`` (:func:`no_output`). Never raises for what the command does."""
        if ctx.output_ref() is None:
            return no_output(ctx)
        with tempfile.TemporaryDirectory(prefix="reel-verify-") as tmp:
            path = Path(tmp) / "output"
            with path.open("wb") as out:
                await ctx.output_to(out)  # raises BlobMissing/BlobCorrupt: an error verdict (run_verifier)
            env = spec_env(os.environ, self._spec, {
                OUTPUT_FILE_ENV: str(path), "REEL_RUN_ID": ctx.run, "REEL_BRANCH_ID": ctx.branch,
                "REEL_STEP_ID": ctx.step, "REEL_ATTEMPT": str(ctx.attempt), "REEL_SNAPSHOT_LSN": str(ctx.snapshot_lsn),
                **await _workspace(ctx, Path(tmp) / "workspace")})
            # stop a little before the ctx deadline, so the kill is ours and the reason says so
            budget_s = min(self._timeout_s, ctx.remaining_s())
            with path.open("rb") as stdin:
                return await self._run(stdin, env, budget_s - min(KILL_MARGIN_S, budget_s / 2))

    async def _run(self, stdin: BinaryIO, env: Mapping[str, str], timeout_s: float) -> VerdictResult:
        try:
            done = await run_group(self._argv, timeout_s=timeout_s, env=env, stdin=stdin,
                                   output_limit_bytes=OUTPUT_TAIL_BYTES, keep="tail", merge_stderr=True)
        except OSError as exc:
            return errored(f"cannot run {self._argv[0]!r}: {exc.strerror}")
        if done.timed_out:
            return errored(f"{self._argv[0]} did not finish within its {self._timeout_s:g}s timeout (killed)")
        tail = done.text().strip().splitlines()[-1:] or [""]
        said = f": {tail[0][:200]}" if tail[0] else ""
        if done.returncode == 0:
            return passed(f"{self._argv[0]} exited 0{said}")
        return failed(f"{self._argv[0]} exited {done.returncode}{said}")


async def _workspace(ctx: VerifierCtx, into: Path) -> dict[str, str]:
    """``REEL_WORKSPACE``: the judged branch's workspace as of the pinned LSN, materialised into ``into`` (a copy
    of the verifier's own, removed with its temporary folder); nothing for a run without a workspace."""
    ref = ctx.episode.workspace
    if isinstance(ref, msgspec.UnsetType):
        return {}
    await workspace.materialise(ref, into, ctx.blobs)
    return {"REEL_WORKSPACE": str(into)}
