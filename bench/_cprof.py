"""``python bench/_cprof.py OUT MODULE``: run ``python -m MODULE`` under cProfile timed in CPU seconds of this
process (``time.process_time``, not wall time: waits and preemption are not counted); the stats go to OUT
when the module returns (a service returns on SIGTERM). For bench/_wkr_reel.py's ``WKR_PROFILE_DIR``."""

from __future__ import annotations

import cProfile
import runpy
import sys
import time

if __name__ == "__main__":
    out, module = sys.argv[1], sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    prof = cProfile.Profile(time.process_time)
    try:
        prof.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    finally:
        prof.dump_stats(out)
