"""README's Python quick start runs as written: the block after the ``python-quick-start`` marker, saved as a
script in an empty folder and run by this interpreter (Reel installed as README's ``pip install`` leaves it),
prints the outcome, the answer and the verdict README says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- python-quick-start:"


def quick_start() -> tuple[str, str]:
    """The block's code and the output README announces for it (the last `` prints `…` `` before the marker)."""
    text = (REPO / "README.md").read_text()
    before, _, after = text.partition(MARKER)
    assert after, "README has no python-quick-start block"
    code = re.search(r"```python\n(.*?)```", after, re.S)
    said = re.findall(r"prints `([^`]+)`", before)
    assert code is not None and said
    return code.group(1), said[-1]


def test_readme_python_quick_start_runs_as_written(tmp_path: Path) -> None:
    code, expected = quick_start()
    assert len(code.splitlines()) + 1 <= 20  # with README's `pip install` line: ≤ 20 lines to a verdict
    (tmp_path / "quickstart.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REEL_", "NATS_"))}
    done = subprocess.run([sys.executable, "quickstart.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
    assert not (tmp_path / ".reel").exists()  # the embedded store was a temporary one
