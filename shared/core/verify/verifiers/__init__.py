"""Verifiers, the pure part: what a verifier gets and answers, the built-ins (docs/verifiers.md).

What judges a run resting in ``Verifying``. This package holds the
types (:mod:`.context`) and the built-ins that need nothing but the ctx
(:mod:`.builtin`); the run's outcome from its verdicts is
:func:`reel.shared.core.verify.verification.derive_outcome`. The ``command``
verifier runs a process (:mod:`reel.shared.proc.verifier`); building a verifier from
its spec (import paths included) and running it under its deadline is
:mod:`reel.shared.application.verifierrun`.
"""

from reel.shared.core.verify.verifiers.builtin import ContextRequires, OutputJsonSchema, OutputRegex, RecordedOutcome
from reel.shared.core.verify.verifiers.context import (
    VERIFIER_READ_MAX_BYTES,
    BlobReader,
    OutputTooLarge,
    VerdictResult,
    Verifier,
    VerifierCtx,
    VerifierInvalid,
    checked,
    errored,
    failed,
    make_ctx,
    passed,
)

__all__ = [
    "VERIFIER_READ_MAX_BYTES", "BlobReader", "ContextRequires", "OutputJsonSchema", "OutputRegex", "OutputTooLarge",
    "RecordedOutcome", "VerdictResult", "Verifier", "VerifierCtx", "VerifierInvalid", "checked", "errored", "failed",
    "make_ctx", "passed",
]
