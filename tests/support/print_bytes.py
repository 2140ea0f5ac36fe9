"""A tool that prints exactly N bytes of a pattern that never repeats (each line names its offset).

Usage: ``python tests/support/print_bytes.py N [--stderr-tail TEXT]``; :func:`expected` is what it prints,
so a test can check a head or a sha256 against the bytes a real process wrote through a pipe.
"""

from __future__ import annotations

import sys

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


def main(argv: list[str]) -> None:
    n, i = int(argv[0]), 0
    w = sys.stdout.buffer
    block = 1024  # lines per write: 64 KiB
    while i < n:
        chunk = b"".join(line_at(j) for j in range(i, min(n, i + 64 * block), 64))[:n - i]
        w.write(chunk)
        i += len(chunk)
    w.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
