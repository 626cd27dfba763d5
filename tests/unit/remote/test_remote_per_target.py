"""The input root is a target's, not a module's (issue 45, item 3): the modules of a target
share one input root, whose blobs are asked about (FindMissingBlobs) and sent once, by the
first module; the others wait for that and send only their own Command and Action. The
first module's action cache lookup answers for the target: after a miss the others do not
ask."""

from __future__ import annotations

import asyncio
from pathlib import Path

from metrale_orch.executor.reapi import ReapiBackend
from metrale_orch.remote import AsyncRemoteClient
from tests.support.reapi_load import run_all, stage_forms
from tests.support.reapi_standin import StandIn, standin_engine

TARGETS = 3
MODULES = 8


async def run_targets(engine: StandIn, top: Path) -> None:
    forms = stage_forms(top, TARGETS * MODULES, per_target=MODULES)
    backend = ReapiBackend(AsyncRemoteClient(engine.url))
    try:
        runs = await run_all(backend, forms)  # every module of every target at once
    finally:
        await backend.client.aclose()
    assert all(r.returncode == 0 for r in runs)


def test_a_targets_input_root_is_asked_about_and_sent_once(tmp_path: Path) -> None:
    with standin_engine(workers=TARGETS * MODULES, seconds=0.01) as engine:
        asyncio.run(run_targets(engine, tmp_path))
        methods = engine.fake.methods()
    assert engine.executed == TARGETS * MODULES
    # At most once per target (a later target's root may hold only blobs already sent,
    # the shared headers, and few enough new ones to send unasked).
    assert 1 <= methods.count("FindMissingBlobs") <= TARGETS, methods
    # At most one batch per target for its root, one per module for its Command and Action.
    assert methods.count("BatchUpdateBlobs") <= TARGETS + TARGETS * MODULES, methods
    # The action cache is asked once per target: the first module's miss answers for the
    # others, which Execute's own lookup then serves.
    assert methods.count("GetActionResult") == TARGETS, methods
