"""A loop thread in a forked process (doit's ``-P process`` workers fork the build process):
the child starts a loop of its own rather than handing its coroutines to a thread the fork
did not copy, where they would wait forever."""

from __future__ import annotations

import asyncio
import os

from metrale_orch.remote.loop import LoopThread


async def pid() -> int:
    await asyncio.sleep(0)
    return os.getpid()


def test_a_forked_child_runs_on_a_loop_of_its_own() -> None:
    loop = LoopThread("test-fork")
    assert loop.run(pid()) == os.getpid()  # started here, before the fork
    child = os.fork()
    if child == 0:  # the child: exit 0 only if its coroutine ran, within 10 s
        try:
            ok = loop.submit(pid()).result(timeout=10) == os.getpid()
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    loop.close()
    assert os.waitstatus_to_exitcode(status) == 0
