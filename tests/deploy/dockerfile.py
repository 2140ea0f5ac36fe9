"""What the tests need to know of deploy/Dockerfile: its final stage's user, environment, directories and commands.

A small reader, not a Dockerfile implementation: continuation lines are joined,
comments dropped, ``ENV k=v …`` and the exec (JSON) forms of ``ENTRYPOINT``,
``CMD`` and ``HEALTHCHECK … CMD`` are understood, and only the last stage counts.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile"


@dataclass
class Image:
    """The final stage of a Dockerfile, as the tests read it."""

    base: str = ""
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = "/"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    copies: list[str] = field(default_factory=list)
    """The sources of every ``COPY`` (build-context paths)."""

    @property
    def uid_gid(self) -> tuple[int, int]:
        """The numeric ``USER uid:gid`` (gid = uid when absent).

        Raises:
            ValueError: the user is a name, not a number.
        """
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def read(path: Path = DOCKERFILE) -> Image:
    """The final stage of the Dockerfile at ``path``."""
    img = Image()
    for word, args in instructions(path.read_text()):
        if word == "FROM":
            img = Image(base=args.split()[0])
        elif word == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                img.env[key] = value
        elif word == "USER":
            img.user = args
        elif word == "WORKDIR":
            img.workdir = args if args.startswith("/") else str(Path(img.workdir) / args)
        elif word == "ENTRYPOINT":
            img.entrypoint = json.loads(args)
        elif word == "CMD":
            img.cmd = json.loads(args)
        elif word == "HEALTHCHECK":
            m = re.search(r"\bCMD\s+(\[.*\])\s*$", args)
            img.healthcheck = json.loads(m.group(1)) if m else []
        elif word == "COPY":
            parts = [p for p in args.split() if not p.startswith("--")]
            img.copies.extend(parts[:-1])
    return img
