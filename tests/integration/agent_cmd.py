"""The ``command:`` tool of the live agent tests: ``python agent_cmd.py <log dir> [exit code]``.

Reads its arguments (JSON) from stdin, checks they equal ``$REEL_TOOL_ARGS``, meets the python
tool when ``meet_in`` names a folder (agent_tools.meet), appends one
line per run to ``<log dir>/runs.jsonl`` and prints a JSON result: the arguments, the
call's idempotency key and attempt, and the value of ``$REEL_TEST_AGENT_KEY`` (which the
executor must never pass on: the test checks it is empty and greps every blob for the key).
With ``$REEL_TEST_HOLD_DIR`` set and attempt 1, it announces itself there and sleeps.
"""

import json
import os
import sys
import time
from pathlib import Path

log_dir, code = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0
raw = sys.stdin.read()
args = json.loads(raw)
assert raw == os.environ["REEL_TOOL_ARGS"], (raw, os.environ["REEL_TOOL_ARGS"])
attempt = int(os.environ["REEL_ATTEMPT"])
record = {"args": args, "idempotency_key": os.environ["REEL_IDEMPOTENCY_KEY"], "attempt": attempt,
          "step": os.environ["REEL_STEP_ID"], "leaked_key": os.environ.get("REEL_TEST_AGENT_KEY", "")}
with (log_dir / "runs.jsonl").open("a") as f:
    f.write(json.dumps(record) + "\n")
if args.get("meet_in"):  # a rendezvous with the python tool: both run at once
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.integration.agent_tools import meet

    meet(args["meet_in"], "command.here", "python.here")
hold = os.environ.get("REEL_TEST_HOLD_DIR")
if hold and attempt == 1:
    Path(hold, f"command.{attempt}.started").write_text(record["idempotency_key"])
    time.sleep(3600)
print(json.dumps(record))
if code:
    print("checks failed: 1 of 3", file=sys.stderr)
sys.exit(code)
