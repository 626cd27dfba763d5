"""The run's toolchain probes, started before anything needs them (I/O).

A no-op ``doit build`` cannot skip the probes (a wrapper can switch the real
compiler without a change any ``stat`` would see), but it need not wait for
them: :func:`start_probes`, called when doit imports the dodo file, runs the probes
of the toolchains the targets selected last time, for the arches they built for
(every toolchain the first time: :func:`~metrale_orch.tasks.taskkey.stamp_wanted`) on
a background thread while the rest of the package is imported and doit reads its
configuration. Task generation then asks the same memo (the run's
:attr:`~metrale_orch.tasks.run.Run.probes`) and gets the probes already run or waits for
the ones in flight; the builds of the run reuse them too. Only an early start: a probe
that fails here is not remembered and fails again, with its message, where it is asked
for.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

from metrale_orch.tasks.run import Run

__all__ = ["start_probes"]


def start_probes(run: Run, scope: Sequence[str] | None = None) -> threading.Thread:
    """Probe the toolchains of the run's project that its targets (those in ``scope``,
    see :func:`~metrale_orch.tasks.creators.cached_tasks`) selected last time on a daemon
    thread, into the run's memo (the same stamps the task cache's key computes; the first
    time, all of them for the whole tree, none for a scope)."""
    env = dict(run.environ)

    def work() -> None:
        from metrale_orch.tasks.taskkey import stamp_wanted

        # Only an early start: whatever fails here is met again, with its own message,
        # where the probe is asked for. That includes what a run ending under this
        # daemon thread raises in it (a build that stops at once, on a full disk: the
        # probe pools' "cannot schedule new futures after interpreter shutdown"), which
        # must not print a traceback after the run's own one-line error.
        with contextlib.suppress(Exception):
            stamp_wanted(run.root, env, run.config(), run.probes, scope)

    thread = threading.Thread(target=work, name="metrale-probes", daemon=True)
    thread.start()
    return thread
