"""Python tools of the canary test (test_tool_secrets.py) that try to hand the executor's secrets out.

They run inside the executor, so they can read its environment: what they return, raise and log must reach
no record unscrubbed.
"""

from __future__ import annotations

import os

import structlog

from reel.shared.core.verify.verifiers.context import VerdictResult, VerifierCtx, passed

NAMES = ("REEL_NATS_USER", "REEL_NATS_PASSWORD", "REEL_TEST_MODEL_KEY")


def leak() -> dict[str, str | None]:
    """Return the secrets."""
    return {name: os.environ.get(name) for name in NAMES}


def leak_error() -> str:
    """Raise with the password in the message."""
    raise RuntimeError(f"could not log in with {os.environ.get('REEL_NATS_PASSWORD')}")


def leak_log() -> str:
    """Log the model key and the password, return nothing secret."""
    structlog.get_logger("reel.tests.leak").warning("tool.leaking", key=os.environ.get("REEL_TEST_MODEL_KEY"),
                                                     nested={"pw": [os.environ.get("REEL_NATS_PASSWORD")]})
    return "logged"


class LeakyVerifier:
    """A python verifier (it runs inside the verifier service) whose reason quotes the model key."""

    def __init__(self, spec: object) -> None:
        self.spec = spec

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        return passed(f"judged with {os.environ.get('REEL_TEST_MODEL_KEY')}")
