"""Run a Python module under cProfile in every thread, the stats merged into one file.

    python bench/profile_threads.py OUT.prof -m doit build

cProfile alone sees the main thread; a build's remote actions run on executor threads.
Each thread started after this wraps its ``run`` in a profiler of its own, timed by the
thread's CPU time (``time.thread_time``: a thread waiting on the network or a lock costs
nothing); at exit the main thread's and every thread's stats are merged into ``OUT.prof``
(``pstats`` reads it). Timing each call costs: the total is several times the unprofiled CPU.
"""

from __future__ import annotations

import cProfile
import pstats
import runpy
import sys
import threading
import time
from typing import Any


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit(__doc__)
    out, module = sys.argv[1], sys.argv[3]
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()
    plain_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)
        with lock:
            profiles.append(profile)
        profile.enable()
        try:
            plain_run(self)
        finally:
            profile.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    main_profile = cProfile.Profile(time.thread_time)
    sys.argv = [module, *sys.argv[4:]]
    code: Any = 0
    main_profile.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    finally:
        main_profile.disable()
        with lock:
            stats = pstats.Stats(main_profile)
            for profile in profiles:
                stats.add(profile)
        stats.dump_stats(out)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
