"""Custom verifiers for the tests, loaded by the verifier service by import path.

``python`` verifiers named ``tests.integration.parking:<Class>`` find their
rendezvous in a module-level registry keyed by the verifier's configured name, so
each test arms its own (``arm(name)``) and several tests never share one. They
only work in-process (the registry lives in the test's interpreter), except
:class:`ProcParker`, which signals over NATS for a verifier running in a subprocess.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

from reel.shared.core.run.views import serialize_view
from reel.shared.core.verify.verifiers import VerdictResult, VerifierCtx
from reel.shared.core.workflow.spec import VerifierSpec

PARK_SUBJECT_ENV = "REEL_TEST_PARK_SUBJECT"


@dataclass
class Rendezvous:
    """The test's side of a parking verifier.

    Attributes:
        parked: set from inside ``verify`` once the held view has been serialized.
        release: the verifier waits on it.
        before / after: ``serialize_view(ctx.episode)`` when parking / after release.
        ctxs: every ctx the verifier was called with (only the first ``park_calls`` park).
    """

    park_calls: int = 1
    parked: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    before: bytes = b""
    after: bytes = b""
    ctxs: list[VerifierCtx] = field(default_factory=list)

    @property
    def held(self) -> VerifierCtx:
        """The ctx the parked verifier holds."""
        return self.ctxs[0]


_REGISTRY: dict[str, Rendezvous] = {}
_CALLS: dict[str, int] = {}
_BARRIERS: dict[str, asyncio.Barrier] = {}


def arm(name: str, park_calls: int = 1) -> Rendezvous:
    """A fresh rendezvous for the verifier configured as ``name``."""
    rv = _REGISTRY[name] = Rendezvous(park_calls=park_calls)
    return rv


def calls(name: str) -> int:
    """How many times a :class:`Counting` verifier named ``name`` ran in this process."""
    return _CALLS.get(name, 0)


def barrier(name: str, parties: int) -> asyncio.Barrier:
    """Arm a :class:`Meeting` verifier: each call waits until ``parties`` calls are in flight."""
    b = _BARRIERS[name] = asyncio.Barrier(parties)
    return b


class _Base:
    version = "t1"

    def __init__(self, spec: VerifierSpec) -> None:
        self.name = spec.label


class Parking(_Base):
    """Parks on its rendezvous mid-verify: serializes the held view, signals, waits, re-serializes."""

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        rv = _REGISTRY[self.name]
        rv.ctxs.append(ctx)
        if len(rv.ctxs) > rv.park_calls:
            return VerdictResult(status="pass", score=1.0, reason=f"not parked (call {len(rv.ctxs)})")
        rv.before = serialize_view(ctx.episode)
        rv.parked.set()
        await rv.release.wait()
        rv.after = serialize_view(ctx.episode)
        rv.done.set()
        return VerdictResult(status="pass", score=1.0, reason="released after park")


class Counting(_Base):
    """Passes, counting its calls in this process."""

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        _CALLS[self.name] = _CALLS.get(self.name, 0) + 1
        return VerdictResult(status="pass", score=0.75, reason=f"{self.name} call {_CALLS[self.name]}")


class Meeting(_Base):
    """Waits until the armed number of calls are in flight at once (proves parallel instances)."""

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        await _BARRIERS[self.name].wait()
        return VerdictResult(status="pass", score=1.0, reason="met")


class Raises(_Base):
    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        raise RuntimeError("verifier exploded")


class Sleeps(_Base):
    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Stubborn(_Base):
    """Swallows the first cancellation (a misbehaving verifier): still no hang."""

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(2.5)  # longer than run_verifier's grace: abandoned, not awaited
        return VerdictResult(status="pass", score=1.0, reason="too late")


class BadScore(_Base):
    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        return VerdictResult(status="pass", score=7.0, reason="too good")


class PromptReader(_Base):
    """Fetches the judged attempt's prompt lazily, proving ``blobs`` works on demand."""

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        a = ctx.attempt_view
        assert a is not None and a.prompt_ref is not None
        prompt = (await ctx.blobs.get(a.prompt_ref)).decode()
        ok = "<context id='doc-a'" in prompt
        return VerdictResult(status="pass" if ok else "fail", score=1.0 if ok else 0.0,
                             reason=f"prompt has {len(prompt)} chars")


def proc_parker(spec: VerifierSpec) -> ProcParker:
    """Factory form (a callable taking the spec), used by the restart test."""
    return ProcParker(spec)


class ProcParker(_Base):
    """In a subprocess with ``$REEL_TEST_PARK_SUBJECT``: announce on NATS, then hang forever.

    Elsewhere (the instance that takes over after the kill): pass at once.
    """

    async def verify(self, ctx: VerifierCtx) -> VerdictResult:
        subject = os.environ.get(PARK_SUBJECT_ENV)
        if not subject:
            return VerdictResult(status="pass", score=1.0, reason="resumed elsewhere")
        import nats

        nc = await nats.connect(os.environ["NATS_URL"])
        await nc.publish(subject, f"{ctx.run}:{ctx.snapshot_lsn}".encode())
        await nc.flush()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")
