"""``metrale-orch resources --diff`` names spill growth for what it is (issue 43).

A kernel that spills where it did not is a ``[new spill]``; one that already spilled and
now spills more bytes is a ``[more spill]`` (as ``--check`` says "more spill bytes"). Both
fail the diff (exit 1). Real tools: a one-target tree built twice with nvcc, the report
from the real ptxas.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.nvcc_tree import built_tree, run_cli

#: The sample tree's register-pressure probe: SUMS running sums live under 32 registers.
PROBE = REPO / "kernels/hopper/qwen3-8b/bf16/spill_probe.cu"
TARGET = "h/m/q"

pytestmark = pytest.mark.nvcc


def _probe(kernel: str, sums: int) -> str:
    text = PROBE.read_text().replace("#define SPILL_SUMS 40", f"#define SPILL_SUMS {sums}")
    return text.replace("spill_probe(", f"{kernel}(")


def _built(root: Path, grows: int, starts: int) -> Path:
    """A tree whose ``grows`` kernel keeps GROWS sums and ``starts`` STARTS, built."""
    files = {
        "kernels/h/HARDWARE.toml": '[hardware]\narch = "sm_90a"\n',
        "kernels/h/m/MODEL.toml": "[model]\n",
        "kernels/h/m/q/grows.cu": _probe("grows", grows),
        "kernels/h/m/q/starts.cu": _probe("starts", starts),
    }
    return built_tree(root, files, [TARGET])


def _base_and_now(
    tmp_path: Path, base: tuple[int, int], now: tuple[int, int]
) -> tuple[Path, Path, dict[str, str]]:
    """The tree built with (grows, starts) sums ``base``, then ``now``, and the environment."""
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc and ptxas are not installed")
    return _built(tmp_path / "base", *base), _built(tmp_path / "now", *now), dict(os.environ)


def test_more_spill_is_not_called_new(tmp_path: Path) -> None:
    base, now, environ = _base_and_now(tmp_path, (40, 4), (48, 40))
    code, out, _ = run_cli(base, ["resources", TARGET, "--json"], environ)
    (target,) = json.loads(out)["targets"]
    spills = {k["kernel"]: k["spill_store_bytes"] for m in target["modules"] for k in m["kernels"]}
    assert spills["grows"] > 0 and spills["starts"] == 0  # the base: one spills, one not

    code, out, err = run_cli(now, ["resources", TARGET, "--diff", str(base / "build")], environ)
    assert err == ""
    grows, starts, summary = out.splitlines()
    assert grows.startswith(f"{TARGET} grows sm_90a: ") and grows.endswith("  [more spill]")
    assert starts.startswith(f"{TARGET} starts sm_90a: ") and starts.endswith("  [new spill]")
    assert "spill stores 0 → " in starts
    assert summary.endswith("2 kernels changed (2 kernels now), 1 new spill, 1 more spill")
    assert code == 1

    code, out, _ = run_cli(
        now, ["resources", TARGET, "--diff", str(base / "build"), "--json"], environ
    )
    doc = json.loads(out)
    assert [(c["kernel"], c["spill"]) for c in doc["changes"]] == [
        ("grows", "more"),
        ("starts", "new"),
    ]
    assert (doc["new_spills"], doc["more_spills"], code) == (1, 1, 1)


def test_more_spills_are_counted_in_the_plural(tmp_path: Path) -> None:
    """Two kernels spilling more: "2 more spills", as "2 new spills" (issue 43 review)."""
    base, now, environ = _base_and_now(tmp_path, (40, 40), (48, 48))
    code, out, _ = run_cli(now, ["resources", TARGET, "--diff", str(base / "build")], environ)
    assert out.splitlines()[-1].endswith("(2 kernels now), 0 new spills, 2 more spills")
    assert code == 1
