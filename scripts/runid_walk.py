"""Follow one run id through the code: ``reel run WORKFLOW`` in this process (its own embedded server and
in-process services), with a profile hook on every thread that notes each call of a function of this
repository whose arguments hold the id of the run it starts (the id itself, or an object whose ``run_id`` is it).

Prints the walk's figures: the modules visited (distinct files), the hops (calls that enter a module other
than the one of the walk's previous call) and the returns (hops back into a module the walk had already left).
The walk is followed per asyncio task (per thread outside a loop), so calls of concurrent tasks that happen to
interleave are not counted as hops between them; hops and returns are the sums over the tasks. Modules under
``services/cli/`` and ``services/timeline`` (the command line's own output) are left out.

Usage:  python scripts/runid_walk.py CLI_MODULE WORKFLOW [--list]
  CLI_MODULE: the ``reel`` command's module (``reel.services.cli``; ``services.cli`` in older checkouts).
"""

from __future__ import annotations

import asyncio
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
    seen: list[tuple[str, str, str, tuple[int, int]]] = []  # (run id, module, function, task) of each call
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
            try:
                task = id(asyncio.current_task())
            except RuntimeError:  # no running loop in this thread
                task = 0
            seen.append((rid, mod, frame.f_code.co_name, (threading.get_ident(), task)))

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
    mine = [(mod, fn, task) for rid, mod, fn, task in seen if rid == m.group(1)]  # this run's only
    walk = [mod for mod, _, _ in mine]
    funcs: dict[str, set[str]] = {}
    tasks: dict[tuple[int, int], list[str]] = {}
    for mod, fn, task in mine:
        funcs.setdefault(mod, set()).add(fn)
        tasks.setdefault(task, []).append(mod)
    hops, returns = 0, 0
    pairs_seen: list[tuple[str, str]] = []
    for path in tasks.values():
        left = set[str]()
        for prev, cur in itertools.pairwise(path):
            if cur != prev:
                hops += 1
                left.add(prev)
                returns += cur in left
                pairs_seen.append((prev, cur))
    print(f"exit {code}; modules {len(set(walk))}; calls {len(walk)}; hops {hops}; returns {returns}")
    if pairing:
        from collections import Counter
        pairs = Counter(pairs_seen)
        for (a, b), n in pairs.most_common(25):
            print(f"  {n:5d}  {a} -> {b}")
    if listing:
        for m in sorted(set(walk)):
            print(f"  {walk.count(m):5d}  {m}: {', '.join(sorted(funcs[m]))}")


if __name__ == "__main__":
    main()
