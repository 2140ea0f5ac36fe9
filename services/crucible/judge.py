"""The judge: a command that prints a score, frozen by a fingerprint.

Fingerprint — sha256 over: the command (``{python}`` resolved), the direction,
the declared environment, and the content of every file the judge reads
(``reads``: files, or directories hashed recursively by relative path and
content; a missing one hashes as missing). It is recorded when a segment opens
and recomputed before every measurement; any difference stops the run.

Output — the judge's last non-empty stdout line is either a JSON object
``{"score": <number>, "total": <int, optional>, "cost_usd": <number, optional>}``, a
bare number, or a line containing ``score: <number>`` / ``score=<number>``. A reported
``cost_usd`` is counted against the budget whatever the exit (a timeout included: the
output printed until the kill is read).

Where it runs — in the session's measure tree, a clean checkout of the measured sha
(:meth:`reel.services.crucible.world.GitWorld.measure_tree`), never in the world; ``reads``
are hashed there too, so the fingerprint covers exactly what the judge runs.

Readings — exit 0 with a finite value is a valid repeat. A non-zero exit (crash),
a timeout, NaN/±inf or no value is an :class:`~reel.shared.crucible.state.InvalidReading`
(never a score, never a keep); the measurement stops at the first invalid repeat.
Exit 75 (EX_TEMPFAIL) means "a resource I need is unavailable": an
:class:`Unavailable`, which parks the iteration instead of discarding it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reel.services.crucible import proc
from reel.shared.crucible.config import JudgeSpec
from reel.shared.crucible.noise import aggregate
from reel.shared.crucible.state import InvalidReading, Measurement, Reading

_SCORE_RE = re.compile(r"score\s*[:=]\s*([^\s,;]+)", re.IGNORECASE)
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Fingerprint:
    """The judge's identity: ``digest`` over ``parts`` (component name → sha256 hex)."""

    digest: str
    parts: dict[str, str]

    def changed(self, other_parts: dict[str, str]) -> tuple[str, ...]:
        """Component names whose hash differs from ``other_parts`` (added/removed included)."""
        keys = set(self.parts) | set(other_parts)
        return tuple(sorted(k for k in keys if self.parts.get(k) != other_parts.get(k)))


@dataclass(frozen=True)
class Unavailable:
    """The judge (or proposer) reported a missing resource (exit 75): wait and retry, do not discard."""

    reason: str
    cost_usd: float = 0.0


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_file(path: Path, h: hashlib._Hash) -> None:
    with path.open("rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)


def hash_path(path: Path) -> str:
    """The sha256 hex of a file's content, of a directory's files (by relative path and content), or of
    "missing"."""
    if path.is_file():
        h = hashlib.sha256(b"file\0")
        _hash_file(path, h)
        return h.hexdigest()
    if path.is_dir():
        h = hashlib.sha256(b"dir\0")
        for f in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(str(f.relative_to(path)).encode() + b"\0")
            _hash_file(f, h)
            h.update(b"\0")
        return h.hexdigest()
    return _sha(b"missing")


def read_path(world: Path, read: str) -> Path:
    """Where a ``reads`` entry points: world-relative unless absolute."""
    p = Path(read)
    return p if p.is_absolute() else world / p


def fingerprint(spec: JudgeSpec, world: Path) -> Fingerprint:
    """Compute the judge's fingerprint against the world as it is now (reads files; blocking)."""
    parts = {
        "command": _sha(json.dumps(proc.resolve_argv(spec.command)).encode()),
        "direction": _sha(spec.direction.encode()),
        "env": _sha(json.dumps(sorted(spec.env.items())).encode()),
    }
    for read in spec.reads:
        parts[f"read:{read}"] = hash_path(read_path(world, read))
    digest = _sha(json.dumps(sorted(parts.items())).encode())
    return Fingerprint(digest=digest, parts=parts)


async def fingerprint_async(spec: JudgeSpec, world: Path) -> Fingerprint:
    """:func:`fingerprint` off the event loop."""
    return await asyncio.to_thread(fingerprint, spec, world)


def parse_score(stdout: str) -> tuple[float | None, int | None, str]:
    """``(value, total, problem)`` from the judge's output; ``problem`` is ``""`` when the value is usable.

    ``value`` is ``None`` when no number was found; NaN/±inf come back as values
    with the problem ``"nan"`` / ``"inf"``.
    """
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None, None, "missing value (no output)"
    last = lines[-1]
    value: float | None = None
    total: int | None = None
    if last.startswith("{"):
        try:
            obj = json.loads(last)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            raw, raw_total = obj.get("score"), obj.get("total")
            value = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
            total = int(raw_total) if isinstance(raw_total, int) and not isinstance(raw_total, bool) else None
    else:
        m = _SCORE_RE.search(last)
        token = m.group(1) if m else last.split()[-1]
        try:
            value = float(token)
        except ValueError:
            value = None
    if value is None:
        return None, None, f"missing value (last line: {last[:120]!r})"
    if math.isnan(value):
        return value, total, "nan"
    if math.isinf(value):
        return value, total, "inf"
    return value, total, ""


def reported_cost(stdout: str) -> float:
    """The ``cost_usd`` of the last JSON line of ``stdout`` that carries one (USD, ≥ 0; else 0.0)."""
    for line in reversed([ln.strip() for ln in stdout.splitlines() if ln.strip()]):
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        raw = obj.get("cost_usd") if isinstance(obj, dict) else None
        if isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw) and raw >= 0:
            return float(raw)
    return 0.0


class Judge:
    """Runs one regime's judge command in a measure tree."""

    def __init__(self, spec: JudgeSpec) -> None:
        self.spec = spec

    def env(self) -> dict[str, str]:
        """Minimal inherited environment plus the declared one (nothing else reaches the judge)."""
        return {**proc.base_env(), **self.spec.env}

    async def fingerprint(self, tree: Path) -> Fingerprint:
        """The fingerprint as of now, ``reads`` hashed in ``tree`` (the tree about to be measured)."""
        return await fingerprint_async(self.spec, tree)

    async def once(self, tree: Path, tag: Mapping[str, str] | None = None
                   ) -> tuple[tuple[float, int | None] | InvalidReading | Unavailable, float]:
        """One run of the command in ``tree``: (a finite ``(value, total)``, an invalid reading, or
        unavailable; the cost it reported, USD — counted whatever the exit). ``tag``: what the measurement is
        (session, iteration, target…), for judges that label what they start; the command ignores it."""
        try:
            done = await proc.run(self.spec.command, cwd=tree, env=self.env(), timeout_s=self.spec.timeout_s)
        except OSError as exc:
            return InvalidReading(reason=f"crash: cannot start judge: {exc}"), 0.0
        cost = reported_cost(done.text())
        if done.timed_out:
            return InvalidReading(reason=f"timeout after {self.spec.timeout_s:g}s", judge_ms=done.duration_ms), cost
        if done.returncode == proc.EX_TEMPFAIL:
            why = done.last_line("stderr") or done.last_line() or "judge unavailable (exit 75)"
            return Unavailable(reason=why, cost_usd=cost), cost
        if done.returncode != 0:
            why = done.last_line("stderr") or done.last_line()
            return InvalidReading(reason=f"crash: exit {done.returncode}" + (f": {why}" if why else ""),
                                  judge_ms=done.duration_ms), cost
        value, total, problem = parse_score(done.text())
        if problem or value is None:
            return InvalidReading(reason=problem or "missing value", judge_ms=done.duration_ms), cost
        return (value, total), cost

    async def measure(self, repeats: int, tree: Path, tag: Mapping[str, str] | None = None
                      ) -> Measurement | Unavailable:
        """Run the command ``repeats`` times in ``tree``; a valid :class:`Reading` only if every repeat was valid.

        The reading's ``cost_usd`` sums what every run reported (USD), the failed one included. ``tag`` goes to
        each :meth:`once` with the repeat's number (``crucible.repeat``).
        """
        values: list[float] = []
        total: int | None = None
        wall_ms, cost = 0, 0.0
        for k in range(repeats):
            started = asyncio.get_running_loop().time()
            got, spent = await self.once(tree, {**(tag or {}), "crucible.repeat": str(k)})
            wall_ms += int((asyncio.get_running_loop().time() - started) * 1000)
            cost += spent
            if isinstance(got, Unavailable):
                return Unavailable(reason=got.reason, cost_usd=cost)
            if isinstance(got, InvalidReading):
                return InvalidReading(reason=got.reason, values=tuple(values), judge_ms=wall_ms, cost_usd=cost)
            values.append(got[0])
            total = got[1] if got[1] is not None else total
        return Reading(values=tuple(values), score=aggregate(values), total=total, judge_ms=wall_ms, cost_usd=cost)
