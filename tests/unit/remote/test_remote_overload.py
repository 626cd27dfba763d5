"""An engine that refuses calls as overloaded (RESOURCE_EXHAUSTED), as BuildGrid does past
its thread pool (issue 45, item 4): the actions wait and are sent again rather than run
here, and the window sends fewer at once."""

from __future__ import annotations

from pathlib import Path

from metrale_orch.executor import Action, LocalExecutor
from metrale_orch.executor.offload import RemoteExecutor, Window
from metrale_orch.executor.reapi import ReapiBackend
from metrale_orch.remote import AsyncRemoteClient
from tests.support.executor import run_actions
from tests.support.reapi_load import stage_forms
from tests.support.reapi_standin import standin_engine

ACTIONS = 48
CAPACITY = 6


def test_an_overloaded_engine_is_asked_again_and_the_window_shrinks(tmp_path: Path) -> None:
    forms = stage_forms(tmp_path, ACTIONS)
    with standin_engine(workers=CAPACITY, seconds=0.05, capacity=CAPACITY) as engine:
        backend = ReapiBackend(AsyncRemoteClient(engine.url), queue_timeout=60)
        ex = RemoteExecutor(backend, LocalExecutor(1), remote_jobs=100)  # the default
        actions = [Action(argv=f.argv, cwd=f.root, remote=f, owner="t") for f in forms]
        try:
            done = run_actions(ex, actions)
        finally:
            ex.close()
    assert all(d.where == "remote" for d in done), {d.where for d in done}
    assert ex.counts("t").to_dict() == {"remote": ACTIONS}  # none ran here
    assert engine.refused > 0 and engine.executed == ACTIONS
    assert ex.window.limit <= 50  # the refusals made it send fewer


def test_a_throttled_action_halves_the_window() -> None:
    window = Window(100)
    window.limit = 100  # grown to remote_jobs
    window.ended({"throttled": (0.0, 1.0), "queued": (1.0, 1.01)})
    assert window.limit == 50
    window.ended({"throttled": (0.0, 1.0)})  # within one window of the last back-off: held
    assert window.limit == 50
