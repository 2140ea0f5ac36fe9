"""The image runs ``command`` tools out of the box, proved without a Docker engine.

deploy/Dockerfile's final stage is laid out in a temporary root: the code and the
interpreter root-owned (as ``pip install`` leaves them), ``$HOME`` the user's own
(``useradd --create-home``), ``/tmp`` world-writable, every other directory
root-owned. Its ENTRYPOINT + CMD (``reel serve executor``) then runs as the
image's numeric ``USER``, with the image's environment (absolute paths moved into
the root) and working directory, against the session's real nats-server; a
workflow with a ``command`` tool step (which writes into its working directory)
must succeed, and the image's HEALTHCHECK and the readiness probe
(``python -m reel.services.runtime.health executor``) must pass.

The old image (``USER reel``, ``WORKDIR /app``, no ``REEL_HOME``) fails here: the
tool-process registry ``./.reel/tools`` under the root-owned ``/app`` is not
writable, every command step fails to spawn and the run loops on redelivery.

The code is copied into the layout's ``/app`` (root-owned, as the image's ``COPY``); the
installed dependencies are this interpreter's site-packages, linked (hard links, else
copies) into the layout's venv when the image's uid cannot read them where they are — a
checkout in a 0700 directory, as ``ci-fresh``'s clone is.

Switching uid needs root; as another user the test is skipped with that reason.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reel.shared.core.run.planning import succeeded_output
from reel.shared.core.workflow.spec import parse_workflow
from reel.shared.nats.client import ReelClient
from reel.shared.runtime.config import Config
from tests.conftest import REPO
from tests.deploy import dockerfile

IMAGE = dockerfile.read()
READY = ("python", "-m", "reel.services.runtime.health")
SITE_PACKAGES = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "nats").is_dir())


@dataclass
class Layout:
    """The image's directories under ``root``, and how to run a process in it as the image's user."""

    root: Path
    uid: int
    gid: int
    bin: Path

    def host(self, image_path: str) -> Path:
        """Where an absolute path of the image lies in the layout."""
        return self.root / image_path.lstrip("/")

    def env(self, cfg: Config) -> dict[str, str]:
        """The image's ENV (absolute paths moved into the root), PATH to its ``reel``, and the test's NATS."""
        env = {k: str(self.host(v)) if v.startswith("/") else v for k, v in IMAGE.env.items()}
        return {**env, "PATH": f"{self.bin}:/usr/bin:/bin", "TMPDIR": str(self.host("/tmp")),
                "NATS_URL": cfg.nats_url, "REEL_NAMESPACE": cfg.names.namespace}

    async def run(self, cfg: Config, *argv: str, timeout_s: float = 60) -> tuple[int, str]:
        """Run ``argv`` to its end as the image's user in its working directory; (exit code, output)."""
        proc = await self.spawn(cfg, *argv, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace")

    async def spawn(self, cfg: Config, *argv: str, stdout: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv, user=self.uid, group=self.gid, extra_groups=[], cwd=self.host(IMAGE.workdir),
            env=self.env(cfg), stdout=stdout, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        )


def _mkdir(path: Path, mode: int = 0o755, owner: tuple[int, int] = (0, 0)) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, *owner)
    path.chmod(mode)


def _interpreter() -> Path | None:
    """A Python of this minor version that another uid can execute (this one may live under /root)."""
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for c in (getattr(sys, "_base_executable", ""), os.path.realpath(sys.executable),
              f"/usr/bin/{minor}", f"/usr/local/bin/{minor}"):
        if c and Path(c).is_file() and _world_executable(Path(c)):
            return Path(c)
    return None


def _world_executable(path: Path) -> bool:
    """Every directory above ``path`` is searchable, and ``path`` executable, by others."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in [real, *real.parents])


def _readable_by(path: Path, uid: int, gid: int) -> bool:
    """``uid`` may list ``path``: run as that uid (its own permission check, not a guess from modes)."""
    return subprocess.run(["ls", str(path)], user=uid, group=gid, extra_groups=[], capture_output=True,
                          cwd="/").returncode == 0


def _linked_deps(site: Path) -> str:
    """This interpreter's site-packages (minus this checkout's editable install, which points into the
    checkout) under ``site``: hard links where the filesystem allows, else copies. Their directory."""
    dest = site / "reel-deps"

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(SITE_PACKAGES, dest, copy_function=link, symlinks=True,
                    ignore=shutil.ignore_patterns("__editable__*", "reel-*.dist-info", "__pycache__"))
    for d in [dest, *(p for p in dest.rglob("*") if p.is_dir() and not p.is_symlink())]:
        d.chmod(0o755)
    return str(dest)


@pytest.fixture
def layout() -> Iterator[Layout]:
    if os.geteuid() != 0:
        pytest.skip(f"running as uid {os.geteuid()}: switching to the image's USER {IMAGE.user} needs root")
    uid, gid = IMAGE.uid_gid  # ValueError: the USER is not numeric
    python = _interpreter()
    if python is None:
        pytest.skip(f"no python{sys.version_info.major}.{sys.version_info.minor} here that uid {uid} may execute")
    root = Path(tempfile.mkdtemp(prefix="reel-image-"))
    try:
        root.chmod(0o755)
        home = IMAGE.env["HOME"]
        _mkdir(root / home.lstrip("/"), 0o700, (uid, gid))  # useradd --create-home
        _mkdir(root / "tmp", 0o1777)
        _mkdir(root / "app")  # COPY's destination, root-owned
        for package in ("shared", "services"):  # COPY shared ./shared, COPY services ./services
            shutil.copytree(REPO / package, root / "app" / package, ignore=shutil.ignore_patterns("__pycache__"))
        lay = Layout(root=root, uid=uid, gid=gid, bin=root / "opt" / "venv" / "bin")
        if not lay.host(IMAGE.workdir).exists():
            _mkdir(lay.host(IMAGE.workdir))  # WORKDIR makes a missing directory root-owned
        # The image's interpreter with Reel installed: a venv on a uid-executable Python whose
        # site-packages are this checkout's, and the `reel` console script pip writes.
        venv = root / "opt" / "venv"
        subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        deps = SITE_PACKAGES if _readable_by(Path(SITE_PACKAGES), uid, gid) else _linked_deps(site)
        (site / "reel-image.pth").write_text(f"{root / 'app'}\nimport site; site.addsitedir({deps!r})\n")
        reel = lay.bin / "reel"
        reel.write_text(f"#!{lay.bin / 'python'}\nimport sys\nfrom reel.services.cli import main\nsys.exit(main())\n")
        reel.chmod(0o755)
        probe = subprocess.run([str(lay.bin / "python"), "-c", "import reel.services.cli"], user=uid, group=gid,
                               extra_groups=[], capture_output=True, text=True, cwd=root)
        if probe.returncode != 0:
            pytest.skip(f"uid {uid} cannot import this checkout ({SITE_PACKAGES}): {probe.stderr.strip()[-300:]}")
        yield lay
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_dockerfile_declares_a_numeric_user_a_reel_home_and_a_healthcheck() -> None:
    uid, _ = IMAGE.uid_gid
    assert uid >= 1000, IMAGE.user
    home = IMAGE.env["HOME"]
    for var in ("REEL_HOME", "REEL_TOOL_DIR", "REEL_HEARTBEAT_FILE"):
        assert IMAGE.env[var].startswith(home + "/"), f"{var} must lie in the user's own {home}"
    assert IMAGE.workdir == home or IMAGE.workdir.startswith(home + "/"), "command tools run in a writable cwd"
    assert IMAGE.healthcheck == [*READY, "--live"], IMAGE.healthcheck
    assert IMAGE.entrypoint == ["reel"] and IMAGE.cmd[0] == "serve", (IMAGE.entrypoint, IMAGE.cmd)


async def test_the_image_runs_a_command_tool_as_its_numeric_user(layout: Layout, cfg: Config,
                                                                 client: ReelClient) -> None:
    log = layout.root / "executor.log"
    with log.open("wb") as out:
        executor = await layout.spawn(cfg, *IMAGE.entrypoint, *IMAGE.cmd, stdout=out.fileno())
    try:
        code, text = await layout.run(cfg, *READY, "verifier")  # no verifier in this namespace
        assert code == 1 and "unhealthy: verifier is not consuming" in text, text

        spec = parse_workflow({"name": "image", "steps": [{"kind": "tool", "id": "write", "tool": {
            "type": "command", "argv": ["sh", "-c", 'echo "uid $(id -u) in $(pwd)" > note.txt && cat note.txt'],
            "timeout_s": 30}}]})
        reply = await client.start(spec, timeout_s=60)
        assert reply.ok and reply.run_id, reply
        state = await client.wait_for(reply.run_id, timeout_s=60)
        ref = succeeded_output(state, state.active_branch, "write")
        assert ref is not None, (state.active.attempts, log.read_text()[-3000:])
        workdir = layout.host(IMAGE.workdir)
        assert await client.blobs.get_text(ref) == f"uid {layout.uid} in {workdir}\n"
        assert (workdir / "note.txt").stat().st_uid == layout.uid

        registry = layout.host(IMAGE.env["REEL_TOOL_DIR"])
        assert registry.is_dir() and registry.stat().st_uid == layout.uid  # made by the executor, as the user
        assert list(registry.iterdir()) == []  # the tool's group record is gone with the group

        code, text = await layout.run(cfg, *IMAGE.healthcheck)
        assert code == 0 and text.startswith("ok: heartbeat"), text
        code, text = await layout.run(cfg, *READY, "executor")
        assert code == 0 and f"ok: executor consumer {cfg.names.consumer('executor')}" in text, text
    finally:
        if executor.returncode is None:
            os.killpg(executor.pid, signal.SIGTERM)
        await asyncio.wait_for(executor.wait(), 60)
    assert executor.returncode == 0, log.read_text()[-3000:]
    assert "PermissionError" not in log.read_text()
