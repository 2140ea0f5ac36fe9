"""A tiny real world, judge and proposer for the Crucible tests (real git, real processes).

World (a fresh git repo per test): ``value.txt`` and ``judge.py``. The judge prints
``value.txt`` as the score, or misbehaves on purpose when the value is a keyword:
``nan``, ``inf``, ``crash``, ``missing``, ``timeout``, ``tempfail <n> <score> [<cost>]`` (exit 75
the first ``n`` calls, each billed ``cost`` USD), ``rendezvous`` (writes its pid to the FIFO
``$RENDEZVOUS`` and then hangs). ``$NOISE`` adds deterministic noise from a call
counter in ``$JUDGE_STATE``;
``$DRIFT`` adds ``DRIFT × calls`` (a judge whose readings creep up), ``$SCALE`` multiplies
the score, ``$TOTAL`` is the reported total.

Proposer (outside the world): plays the plan file given as its argument — entry ``CRUCIBLE_ITERATION - 1``
(``{"done": true}`` past the end): ``write`` files, then print its JSON directives
(``note``, ``cost_usd``, ``escalate``, ``rescope``, ``done``) and exit with ``exit``;
``record_head`` writes the world's HEAD and cleanliness (as the proposer found it) to a file;
``once`` plays the step on the iteration's first run and its ``then`` on a re-run;
``commit`` commits the writes itself (``write_after`` then edits on top, uncommitted);
``keep_mtime`` preserves a rewritten file's mtime; ``record_env`` dumps ``CRUCIBLE_BUDGET_*``;
``orphan`` leaves a background child in its group that writes ``evil.txt`` once a gate file
appears, ``orphan_check`` opens that gate if the child still lives; ``fifo`` writes the
proposer's pid into a FIFO and hangs; ``sleep`` sleeps after printing (a timeout).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reel.services.crucible.world import git
from reel.shared.crucible.config import SessionConfig, parse_config

JUDGE = textwrap.dedent('''
    import json, os, random, sys, time
    from pathlib import Path
    state = Path(os.environ["JUDGE_STATE"])
    state.mkdir(parents=True, exist_ok=True)
    calls = state / "calls"
    n = int(calls.read_text()) if calls.exists() else 0
    calls.write_text(str(n + 1))
    words = Path("value.txt").read_text().split()
    kind = words[0]
    if kind == "nan":
        print("score: nan")
    elif kind == "inf":
        print("inf")
    elif kind == "crash":
        raise SystemExit("judge crashed on purpose")
    elif kind == "missing":
        print("no number here")
    elif kind == "timeout":
        time.sleep(60)
    elif kind == "tempfail":
        fails = state / "tempfails"
        k = int(fails.read_text()) if fails.exists() else 0
        if k < int(words[1]):
            fails.write_text(str(k + 1))
            if len(words) > 3:  # what the unavailable call still cost
                print(json.dumps({"cost_usd": float(words[3])}))
            print("gpu pool empty", file=sys.stderr)
            raise SystemExit(75)
        print(json.dumps({"score": float(words[2]), "total": 10}))
    elif kind == "rendezvous":
        with open(os.environ["RENDEZVOUS"], "w") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(300)
    else:
        noise = float(os.environ.get("NOISE", "0"))
        jitter = random.Random(n).uniform(-noise, noise) if noise else 0.0
        scale = float(os.environ.get("SCALE", "1"))
        jitter += float(os.environ.get("DRIFT", "0")) * n
        print(json.dumps({"score": (float(kind) + jitter) * scale, "total": int(os.environ.get("TOTAL", "10"))}))
''')

PROPOSER = textwrap.dedent('''
    import json, os, subprocess, sys, time
    from pathlib import Path
    plan = json.loads(Path(sys.argv[1]).read_text())
    it = int(os.environ["CRUCIBLE_ITERATION"])
    step = plan[it - 1] if it <= len(plan) else {"done": True}
    if "once" in step:  # the first run of this iteration plays the step, a re-run (after a resume) its "then"
        if Path(step["once"]).exists():
            step = step["then"]
        else:
            Path(step["once"]).write_text("x")
    if "hold" in step:  # a rendezvous for tests: say we started, then wait for the gate file
        Path(step["hold"]["started"]).write_text("x")
        while not Path(step["hold"]["gate"]).exists():
            time.sleep(0.01)
    if "record_head" in step:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
        Path(step["record_head"]).write_text(json.dumps({"head": head, "clean": status == ""}))
    if "record_env" in step:
        env = {k: v for k, v in os.environ.items() if k.startswith("CRUCIBLE_BUDGET_")}
        Path(step["record_env"]).write_text(json.dumps(env))
    if "orphan_check" in step:  # is the orphan of an earlier proposer alive? then let it write now
        o = step["orphan_check"]
        pid = int(Path(o["pid"]).read_text())
        try:
            os.kill(pid, 0)
            alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            alive = False
        Path(o["record"]).write_text(json.dumps({"alive": alive}))
        if alive:
            Path(o["gate"]).write_text("x")
            deadline = time.monotonic() + 30
            while not Path(o["done"]).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
    def put(files):
        for rel, text in (files or {}).items():
            p = Path(rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            st = p.stat() if step.get("keep_mtime") and p.exists() else None
            p.write_text(text)
            if st is not None:  # a tool that preserves timestamps (cp -p, rsync -t)
                os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    put(step.get("write"))
    if "commit" in step:  # the proposer commits its own change
        subprocess.run(["git", "add", "-A"], check=True)
        subprocess.run(["git", "-c", "user.name=p", "-c", "user.email=p@x", "commit", "-q", "-m", step["commit"]],
                       check=True)
    put(step.get("write_after"))
    if "orphan" in step:  # a background child in the proposer's group, waiting for a gate to write
        o = step["orphan"]
        code = ("import os, sys, time; from pathlib import Path; "
                f"Path({o['pid']!r}).write_text(str(os.getpid())); "
                f"g = Path({o['gate']!r})\\n"
                "while not g.exists(): time.sleep(0.01)\\n"
                f"Path('evil.txt').write_text('orphan'); Path({o['done']!r}).write_text('x')")
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)  # a background job: `cmd >/dev/null 2>&1 &`
        while not Path(o["pid"]).exists():
            time.sleep(0.01)
    out = {k: step[k] for k in ("note", "cost_usd", "escalate", "rescope", "done") if k in step}
    print(json.dumps(out), flush=True)
    if "fifo" in step:  # say where we are (pid into the FIFO), then hang until killed
        with open(step["fifo"], "w") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(300)
    if "sleep" in step:
        time.sleep(step["sleep"])
    sys.exit(step.get("exit", 0))
''')


ONE_READING = {"confirm_repeats": 0, "remeasure_incumbent": False, "confirm_rule": "mean"}
"""The suite's default noise settings: one reading decides (the tests of confirmation set their own)."""


async def make_repo(root: Path, value: str = "1") -> Path:
    """A git repo with ``value.txt`` and ``judge.py`` committed."""
    repo = root / "src"
    repo.mkdir(parents=True)
    (repo / "value.txt").write_text(value + "\n")
    (repo / "judge.py").write_text(JUDGE)
    await git(repo, "init", "-q", "-b", "main")
    await git(repo, "add", "-A")
    await git(repo, "commit", "-q", "-m", "base")
    return repo


def write_plan(root: Path, plan: Sequence[Mapping[str, Any]]) -> tuple[Path, Path]:
    """The proposer script and its plan file (both outside the world)."""
    script, plan_file = root / "propose.py", root / "plan.json"
    script.write_text(PROPOSER)
    plan_file.write_text(json.dumps(list(plan)))
    return script, plan_file


def config_dict(root: Path, repo: Path, plan: Sequence[Mapping[str, Any]], *, judge_env: Mapping[str, str] = (),
                **over: Any) -> dict[str, Any]:
    """A session config (as data) for the tiny world; ``over`` replaces top-level sections."""
    script, plan_file = write_plan(root, plan)
    env = {"JUDGE_STATE": str(root / "judge-state"), **dict(judge_env)}
    data: dict[str, Any] = {
        "name": "test",
        "world": {"repo": str(repo), "workdir": str(root / "work")},
        "judge": {"command": ["{python}", "judge.py"], "direction": "maximize", "reads": ["judge.py"],
                  "env": env, "timeout_s": 20},
        "proposer": {"command": [sys.executable, str(script), str(plan_file)], "timeout_s": 20},
        "budget": {"iterations": len(plan)},
        "gates": {"retry_s": 0.05},
        "noise": ONE_READING,
    }
    for key, value in over.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def make_config(root: Path, repo: Path, plan: Sequence[Mapping[str, Any]], **kw: Any) -> SessionConfig:
    """:func:`config_dict` validated into a :class:`SessionConfig`."""
    return parse_config(config_dict(root, repo, plan, **kw), config_dir=str(root), cwd=str(root),
                        environ=os.environ)


def write(value: float | str, note: str = "", **extra: Any) -> dict[str, Any]:
    """A plan entry that sets ``value.txt``."""
    return {"write": {"value.txt": f"{value}\n"}, "note": note or f"value {value}", **extra}
