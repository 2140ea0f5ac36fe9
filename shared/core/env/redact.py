"""Scrubbing a service's own secrets out of what it records: each value becomes ``[redacted:NAME]``.

Defence in depth beside the tool environment's allow-list (:mod:`reel.shared.core.env.toolenv`): a
``python`` tool runs inside the executor and can read its environment, so every tool output,
error, prompt and log line passes through :meth:`Secrets.scrub` (or a :class:`StreamScrubber`,
for an output that streams) before it is recorded. A value shorter than
:data:`MIN_SECRET_CHARS` is not scrubbed: it would cut unrelated text to pieces, and no
credential Reel makes is that short.

Pure: the values are arguments (the shell reads them: shared/auth/secrets.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MIN_SECRET_CHARS = 8
"""A value shorter than this (characters) is not scrubbed."""


def marker(name: str) -> str:
    """What replaces the value of secret ``name``."""
    return f"[redacted:{name}]"


@dataclass(frozen=True)
class Secrets:
    """Secret values by name, longest value first (a value inside a longer one is scrubbed with it).

    Build with :func:`secrets_of`. Falsy when there is nothing to scrub.
    """

    pairs: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pairs)

    @property
    def longest_bytes(self) -> int:
        """The longest value's UTF-8 length (bytes): what a :class:`StreamScrubber` holds back, less one."""
        return max((len(v.encode()) for _, v in self.pairs), default=0)

    def scrub(self, text: str) -> str:
        """``text`` with every secret value replaced by its :func:`marker`."""
        for name, value in self.pairs:
            if value in text:
                text = text.replace(value, marker(name))
        return text

    def scrub_bytes(self, data: bytes) -> bytes:
        """:meth:`scrub` of raw bytes (the values matched as UTF-8)."""
        for name, value in self.pairs:
            raw = value.encode()
            if raw in data:
                data = data.replace(raw, marker(name).encode())
        return data

    def scrub_value(self, value: Any) -> Any:
        """``value`` with :meth:`scrub` applied to every string in it (dicts, lists and tuples walked;
        other values as they are): a log line's fields."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {k: self.scrub_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.scrub_value(v) for v in value)
        return value


def secrets_of(named: Iterable[tuple[str, str | None]]) -> Secrets:
    """The :class:`Secrets` of ``(name, value)`` pairs: unset, empty and too short values dropped, each
    value once (the first name given for it)."""
    seen: dict[str, str] = {}
    for name, value in named:
        if value is not None and len(value) >= MIN_SECRET_CHARS and value not in seen:
            seen[value] = name
    return Secrets(tuple(sorted(((n, v) for v, n in seen.items()), key=lambda p: (-len(p[1]), p[0]))))


class StreamScrubber:
    """:meth:`Secrets.scrub_bytes` over a stream of chunks: a value split across chunks is scrubbed too.

    :meth:`feed` returns what is safe to pass on (all but the last ``longest_bytes - 1`` bytes, which may
    start a value); :meth:`end` returns the rest. Pure: no I/O.
    """

    def __init__(self, secrets: Secrets) -> None:
        self._values = [(v.encode(), marker(n).encode()) for n, v in secrets.pairs]
        self._hold = max(0, secrets.longest_bytes - 1)
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The scrubbed bytes of ``pending + chunk`` that no later chunk can change."""
        if not self._values:
            return chunk
        buf = self._pending + chunk
        out, i = bytearray(), 0
        while (hit := self._next(buf, i)) is not None:
            pos, raw, mark = hit
            out += buf[i:pos] + mark
            i = pos + len(raw)
        cut = max(i, len(buf) - self._hold)
        self._pending = buf[cut:]
        if not out:  # the usual case: nothing to replace, one slice
            return buf[i:cut]
        out += buf[i:cut]
        return bytes(out)

    def end(self) -> bytes:
        """The bytes held back (the stream ended: no value can complete them)."""
        rest, self._pending = self._pending, b""
        return rest

    def _next(self, buf: bytes, start: int) -> tuple[int, bytes, bytes] | None:
        best: tuple[int, bytes, bytes] | None = None
        for raw, mark in self._values:  # longest first: at one position the longest value wins
            pos = buf.find(raw, start)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, raw, mark)
        return best
