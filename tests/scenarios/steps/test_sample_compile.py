"""The real thing: every NVIDIA module of the sample tree compiles with nvcc for every arch
that reaches it, two targets at a time, each distinct action key compiled exactly once."""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from metrale_orch.steps.errors import ToolchainMissing
from metrale_orch.steps.results import TargetResult
from metrale_orch.steps.target import build_target
from metrale_orch.toolchain.definitions import builtin_toolchains, select_toolchain
from metrale_orch.toolchain.locate import find_program
from metrale_orch.tree import Layout, resolve_all
from tests.support import REPO
from tests.support.build import make_cache, make_config, output_kinds_tree

log = logging.getLogger(__name__)

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed"),
]


def _layouts() -> list[Layout]:
    assert (REPO / "kernels").is_dir(), "the sample tree kernels/ is part of the repository"
    out = []
    for target, layout in resolve_all(REPO):
        assert isinstance(layout, Layout), f"{target}: {layout}"
        out.append(layout)
    return out


def test_every_nvidia_module_compiles(
    tmp_path: Path,
    record_property: Callable[[str, object], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    environ = dict(os.environ)
    layouts = _layouts()
    tcs = builtin_toolchains()
    nvidia = [lay for lay in layouts if select_toolchain(lay.hardware, tcs).name == "nvcc"]
    others = [lay for lay in layouts if lay not in nvidia]
    assert nvidia, "the sample tree has no NVIDIA target"
    config = make_config(REPO, tmp_path / "cache", build_dir=str(tmp_path / "build"))
    cache = make_cache(config)

    def build(layout: Layout) -> TargetResult:
        return build_target(REPO, layout, config=config, cache=cache, environ=environ)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(build, nvidia))
    wall = time.perf_counter() - start

    failures = [f for r in results for f in r.failures]
    assert not failures, "\n\n".join(str(f) for f in failures)
    outcomes = Counter(m.outcome for r in results for m in r.modules)
    keys = {m.key for r in results for m in r.modules}
    # Each distinct key compiled exactly once; every other use came from the memo or cache.
    assert outcomes["compiled"] == len(keys)
    assert outcomes["compiled"] + outcomes["local"] == sum(len(r.modules) for r in results)

    for layout, result in zip(nvidia, results, strict=True):
        assert [m.stem for m in result.modules] == [stem for stem, _ in layout.modules()]
        out = tmp_path / "build" / str(layout.target)
        for module in result.modules:
            ptx = (out / module.artefact).read_text()
            assert re.search(rf"^\.target {re.escape(layout.hardware.arch or '')}\b", ptx, re.M), (
                f"{layout.target} {module.artefact}: wrong .target"
            )
            assert ".entry " in ptx, f"{layout.target} {module.artefact}: no kernel entry"
        assert (out / "manifest.json").is_file()

    # Trees whose compiler is absent here say what to install.
    for layout in others:
        tc = select_toolchain(layout.hardware, tcs)
        if find_program(tc, environ) is None:
            with pytest.raises(ToolchainMissing, match="install"):
                build(layout)

    summary = (
        f"sample tree: {len(nvidia)} NVIDIA targets, "
        f"{sum(len(r.modules) for r in results)} modules, {len(keys)} distinct keys compiled "
        f"in {wall:.1f} s wall with 2 workers"
    )
    record_property("sample_compile_wall_seconds", round(wall, 2))
    log.info("%s", summary)
    with capsys.disabled():
        print(f"\n{summary}")


def test_output_kinds_and_checkout_independence(tmp_path: Path) -> None:
    from metrale_orch.tree import Target

    environ = dict(os.environ)
    results = {}
    for name in ("a", "b"):
        root = output_kinds_tree(tmp_path / name)
        config = make_config(root, tmp_path / "cache", cache_mode="off")
        hws = ("h", "hc", "hf") if name == "a" else ("h",)
        for hw in hws:
            target = Target(hardware=hw, model="m", quant="q")
            result = build_target(root, target, config=config, cache=None, environ=environ)
            assert not result.failed, result.failure_text()
            (module,) = result.modules
            assert module.outcome == "compiled"
            results[name, hw] = (module, (root / "build" / str(target) / module.artefact))
    ptx_a, ptx_b = results["a", "h"], results["b", "h"]
    # Two checkouts: same key, and nvcc really gives the same bytes.
    assert ptx_a[0].key == ptx_b[0].key
    assert ptx_a[1].read_bytes() == ptx_b[1].read_bytes()
    assert ".target sm_90a" in ptx_a[1].read_text()
    cubin = results["a", "hc"][1]
    assert cubin.name == "tiny.cubin" and cubin.read_bytes()[:4] == b"\x7fELF"
    fatbin = results["a", "hf"][1]
    assert fatbin.name == "tiny.fatbin" and fatbin.stat().st_size > 0
