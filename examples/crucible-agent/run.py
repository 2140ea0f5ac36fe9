"""Run the crucible-agent example in one command, from the repository root:

    python examples/crucible-agent/run.py [--session ID]

It makes the world (a git repository of world/'s files, under ``$REEL_HOME/crucible-agent/``; ``$REEL_HOME``
defaults to ``.reel``), starts the loopback model (model.py) on a free 127.0.0.1 port, and runs
``reel crucible run examples/crucible-agent/crucible.yaml`` against it: an embedded nats-server, the executor and
the verifier in that process (nothing else serves the namespace), the session's table printed at the end. Exit
code: crucible's (0 Solved, 3 Finished…).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO), str(HERE)]

from model import serve  # noqa: E402  (the repository root is on sys.path only now)

GIT_ENV = {"GIT_AUTHOR_NAME": "example", "GIT_AUTHOR_EMAIL": "example@localhost", "GIT_COMMITTER_NAME": "example",
           "GIT_COMMITTER_EMAIL": "example@localhost", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def make_world(into: Path) -> Path:
    """A git repository of world/'s files at ``into`` (replaced if it exists); its path."""
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(HERE / "world", into, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, **GIT_ENV}
    for argv in (["init", "--quiet", "--initial-branch", "main"], ["add", "-A"],
                 ["commit", "--quiet", "-m", "the agent's world"]):
        subprocess.run(["git", *argv], cwd=into, env=env, check=True)
    return into


async def main(home: Path, session: str) -> int:
    world = make_world(home / "crucible-agent" / session)
    server = await serve()
    try:
        env = {**os.environ, "CRUCIBLE_AGENT_WORLD": str(world), "AGENT_MODEL_URL": server.url,
               "AGENT_MODEL_KEY": os.environ.get("AGENT_MODEL_KEY", "crucible-agent-demo-key"), "REEL_HOME": str(home),
               "REEL_LOG_LEVEL": os.environ.get("REEL_LOG_LEVEL", "WARNING")}  # the services' lines: warnings only
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reel.services.crucible.cli", "run", str(HERE / "crucible.yaml"),
            "--session", session, cwd=str(REPO), env=env)
        return await proc.wait()
    finally:
        await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Crucible tunes the instructions of a live agent.")
    parser.add_argument("--session", default=f"agent-{uuid.uuid4().hex[:8]}", help="session id")
    raise SystemExit(asyncio.run(main(Path(os.environ.get("REEL_HOME", ".reel")).resolve(),
                                      parser.parse_args().session)))
