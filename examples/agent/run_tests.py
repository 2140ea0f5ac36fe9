"""The ``run_tests`` tool of the agent example: ``python3 -m unittest`` in the run's scratch copy.

Reel runs it as a command tool (arguments as JSON on stdin, ignored: the tool takes
none) with ``$REEL_RUN_ID`` set; the same command is the example's ``tests-pass``
verifier. Exit status and output are unittest's (a failure is an error observation
for the model), but for the time its summary line gives (``Ran 2 tests``, not ``Ran 2 tests in 0.001s``): the
same files give the same output, so ``reel chaos`` can compare it between runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tools import scratch_dir  # this directory is sys.path[0] when run as a script

if __name__ == "__main__":
    os.chdir(os.environ.get("REEL_WORKSPACE") or scratch_dir(os.environ["REEL_RUN_ID"]))
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run([sys.executable, "-m", "unittest", "-v"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(re.sub(r"^(Ran \d+ tests?) in \d+(\.\d+)?s$", r"\1", done.stdout, flags=re.M))
    sys.exit(done.returncode)
