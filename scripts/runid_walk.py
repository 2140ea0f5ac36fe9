"""Follow one run id through the code: ``reel run WORKFLOW`` in this process (its own embedded server and
in-process services), with a profile hook on every thread that notes each call of a function of this
repository whose arguments hold the id of the run it starts (the id itself, or an object whose ``run_id`` is it).

Prints the walk's figures: the modules visited (distinct files), the hops (calls that enter a module other
than the caller's module in the walk) and the returns (hops back into a module the walk had already left).
Modules under ``services/cli/`` and ``services/timeline`` (the command line's own output) are left out.

Usage:  python scripts/runid_walk.py CLI_MODULE WORKFLOW [--list]
  CLI_MODULE: the ``reel`` command's module (``reel.services.cli``; ``services.cli`` in older checkouts).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import runpy
import sys
import threading
from types import FrameType
from typing import Any

RUN_ID = re.compile(r"r-[0-9a-f]{20}")
ROOT = os.path.realpath(os.getcwd())
SKIP = re.compile(r"services/(cli|timeline)[/.]")


def main() -> None:
    cli, workflow = sys.argv[1], sys.argv[2]
    listing, pairing = "--list" in sys.argv, "--pairs" in sys.argv
    seen: list[tuple[str, str, str]] = []  # (run id, module, function) of each call, in order
    files: dict[str, str | None] = {}

    def module_of(filename: str) -> str | None:
        if filename not in files:
            real = os.path.realpath(filename)
            rel = os.path.relpath(real, ROOT)
            ok = real.startswith(ROOT + os.sep) and rel.split(os.sep)[0] in ("services", "shared") \
                and not SKIP.match(rel)
            files[filename] = rel if ok else None
        return files[filename]

    def run_id_held(frame: FrameType) -> str | None:
        code = frame.f_code
        for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
            v = frame.f_locals.get(name)
            rid = v if isinstance(v, str) else getattr(v, "run_id", None)
            if isinstance(rid, str) and RUN_ID.fullmatch(rid):
                return rid
        return None

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        mod = module_of(frame.f_code.co_filename)
        if mod is not None and (rid := run_id_held(frame)) is not None:
            seen.append((rid, mod, frame.f_code.co_name))

    sys.argv = ["reel", "run", workflow]
    threading.setprofile(hook)
    sys.setprofile(hook)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(cli, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    m = re.search(r"run (r-[0-9a-f]{20}) created", out.getvalue())
    if m is None:
        sys.exit(f"no run created: {out.getvalue()[-500:]}")
    walk = [mod for rid, mod, _ in seen if rid == m.group(1)]  # this run's id only (the store may hold others)
    funcs: dict[str, set[str]] = {}
    for rid, mod, fn in seen:
        if rid == m.group(1):
            funcs.setdefault(mod, set()).add(fn)
    hops, returns, left = 0, 0, set[str]()
    for prev, cur in itertools.pairwise(walk):
        if cur != prev:
            hops += 1
            left.add(prev)
            returns += cur in left
    print(f"exit {code}; modules {len(set(walk))}; calls {len(walk)}; hops {hops}; returns {returns}")
    if pairing:
        from collections import Counter
        pairs = Counter((a, b) for a, b in itertools.pairwise(walk) if a != b)
        for (a, b), n in pairs.most_common(25):
            print(f"  {n:5d}  {a} -> {b}")
    if listing:
        for m in sorted(set(walk)):
            print(f"  {walk.count(m):5d}  {m}: {', '.join(sorted(funcs[m]))}")


if __name__ == "__main__":
    main()
