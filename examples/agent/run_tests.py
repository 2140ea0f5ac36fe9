"""The ``run_tests`` tool of the agent example: ``python3 -m unittest`` in the run's scratch copy.

Reel runs it as a command tool (arguments as JSON on stdin, ignored: the tool takes
none) with ``$REEL_RUN_ID`` set; the same command is the example's ``tests-pass``
verifier. Exit status and output are unittest's (a failure is an error observation
for the model).
"""

from __future__ import annotations

import os
import sys

from tools import scratch_dir  # this directory is sys.path[0] when run as a script

if __name__ == "__main__":
    os.chdir(os.environ.get("REEL_WORKSPACE") or scratch_dir(os.environ["REEL_RUN_ID"]))
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.execv(sys.executable, [sys.executable, "-m", "unittest", "-v"])
