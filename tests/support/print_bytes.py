"""A tool that prints exactly N bytes of a pattern that never repeats (each line names its offset).

Usage: ``python tests/support/print_bytes.py N``; :func:`expected` is what it prints,
so a test can check a head or a sha256 against the bytes a real process wrote through a pipe.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator

LINE_FILL = 50


def line_at(offset: int) -> bytes:
    """The 64-byte line starting at ``offset``."""
    return b"%012d " % offset + b"x" * LINE_FILL + b"\n"


def expected(n_bytes: int) -> bytes:
    """The first ``n_bytes`` the tool prints (for tests; holds them all)."""
    out, i = bytearray(), 0
    while i < n_bytes:
        out += line_at(i)[:n_bytes - i]
        i += 64
    return bytes(out)


def chunks(n_bytes: int, block_bytes: int = 64 * 1024) -> Iterator[bytes]:
    """What the tool prints, ``block_bytes`` (a multiple of 64) at a time."""
    i = 0
    while i < n_bytes:
        chunk = b"".join(line_at(j) for j in range(i, min(n_bytes, i + block_bytes), 64))[:n_bytes - i]
        yield chunk
        i += len(chunk)


def sha256_of(n_bytes: int) -> str:
    """sha256 hex of the first ``n_bytes`` the tool prints, computed without holding them."""
    digest = hashlib.sha256()
    for chunk in chunks(n_bytes):
        digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str]) -> None:
    w = sys.stdout.buffer
    for chunk in chunks(int(argv[0])):
        w.write(chunk)
    w.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
