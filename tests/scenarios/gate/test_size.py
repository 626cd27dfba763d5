"""``metrale-orch size`` (metrale_orch.gate.size) and the ``size_budget`` setting.

Real tools: one kernel built with nvcc as PTX (``h/m/q``), a cubin (``hc/m/q``) and a
fatbin (``hf/m/q``); a fatbin of two images is made with nvcc for the per-arch
breakdown. The budget rules and the setting are also checked on values.

The tests of this topic that run in-process are in ``tests/unit/gate/test_size.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from metrale_orch.gate import check_sizes
from metrale_orch.proc import run_process
from metrale_orch.resources import UnknownBudgetKey
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import make_config, output_kinds_tree, write
from tests.support.gate import TARGETS
from tests.support.resources import _cli

# --- the real thing ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output-kinds tree (PTX, cubin, fatbin), really built; its root."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    tmp = tmp_path_factory.mktemp("size")
    root = output_kinds_tree(tmp / "tree")
    config = make_config(root, tmp / "cache", cache_mode="off")
    for name in TARGETS:
        result = build_target(
            root, Target.parse(name), config=config, cache=None, environ=dict(os.environ)
        )
        assert not result.failed, result.failure_text()
    return root


@pytest.fixture
def root(built: Path, tmp_path: Path) -> Path:
    """A copy of the built tree, free to change (a pyproject, a broken manifest)."""
    return Path(shutil.copytree(built, tmp_path / "tree", symlinks=True))


def _size(root: Path, *argv: str) -> tuple[int, str, str]:
    return _cli(["--root", str(root), *argv], dict(os.environ))


def _file(root: Path, target: str, name: str) -> int:
    return (root / "build" / target / name).stat().st_size


@pytest.mark.nvcc
def test_sizes_per_target_module_and_arch(built: Path) -> None:
    got = check_sizes(built, built / "build", None, {}, "nowhere")
    assert got.budgets == () and got.breaches == ()
    by = {t.target: t for t in got.report.targets}
    assert list(by) == list(TARGETS) and got.report.build_dir == "build"
    for target, artefact, arch in (
        ("h/m/q", "tiny.ptx", "sm_90a"),
        ("hc/m/q", "tiny.cubin", "sm_90a"),
        ("hf/m/q", "tiny.fatbin", "sm_100a"),
    ):
        t = by[target]
        (module,) = t.modules
        assert (t.status, module.module, module.artefact) == ("ok", "tiny", f"{target}/{artefact}")
        assert module.bytes == t.bytes == _file(built, target, artefact) > 0
        (image,) = module.images
        assert image.arch == arch
    # A fatbin's image is its machine code, less the fatbin's headers.
    assert 0 < by["hf/m/q"].modules[0].images[0].bytes < by["hf/m/q"].bytes
    assert check_sizes(built, built / "build", "hc/*", {}, "x").report.targets[0].target == "hc/m/q"


@pytest.mark.nvcc
def test_cli_text_and_a_budget_breach_naming_the_target(root: Path) -> None:
    ptx = _file(root, "h/m/q", "tiny.ptx")
    code, out, err = _size(root, "size")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["target", "module", "arch", "bytes"]
    assert lines[1].split() == ["h/m/q", "tiny", "sm_90a", str(ptx)]
    assert f"h/m/q: {ptx} B in 1 module" in lines
    assert lines[-1].startswith("size: 3 built targets, ") and lines[-1].endswith(
        "; 0 with a budget, 0 over it"
    )

    budget = {"h": f"{ptx - 1}", "hf": "1M", "hf/m/q": "100"}
    code, out, err = _size(root, "--set", f"size_budget={json.dumps(budget)}", "size")
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert f"h/m/q: {ptx} B in 1 module; over its budget of {ptx - 1} B (size_budget.h)" in lines
    fat = _file(root, "hf/m/q", "tiny.fatbin")
    assert any(
        ln.startswith(f"hf/m/q: {fat} B (")
        and ln.endswith('over its budget of 100 B (size_budget."hf/m/q")')
        for ln in lines
    )  # the target's own key over its hardware's
    assert "hc/m/q: " in out and "budget" not in next(
        ln for ln in lines if ln.startswith("hc/m/q:")
    )
    assert lines[-1].endswith("; 2 with a budget, 2 over it")

    # Within budget: exit 0, and the budget shown.
    code, out, _ = _size(root, "--set", f'size_budget={{"h": "{ptx}"}}', "size", "h/*")
    assert code == 0 and f"h/m/q: {ptx} B in 1 module; budget {ptx} B (size_budget.h)" in out


@pytest.mark.nvcc
def test_json_and_markdown(root: Path) -> None:
    budget = '{"hc": "100"}'
    code, out, _ = _size(root, "--set", f"size_budget={budget}", "size", "--json")
    doc = json.loads(out)
    assert code == 1 and out == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert doc["over_budget"] == ["hc/m/q"]
    (b,) = doc["budgets"]
    assert b == {
        "target": "hc/m/q",
        "bytes": _file(root, "hc/m/q", "tiny.cubin"),
        "key": "hc",
        "limit": 100,
        "over": True,
    }
    assert [t["target"] for t in doc["targets"]] == list(TARGETS)
    assert doc["targets"][0]["modules"][0]["images"] == [
        {"arch": "sm_90a", "bytes": _file(root, "h/m/q", "tiny.ptx")}
    ]

    code, md, _ = _size(root, "--set", f"size_budget={budget}", "size", "--format", "markdown")
    assert code == 1
    assert "| target | bytes | size | budget |" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| hc/m/q |"))
    assert row.endswith("| **over its budget of 100 B (size_budget.hc)** |")


@pytest.mark.nvcc
def test_a_bad_budget_is_one_line_exit_2(root: Path) -> None:
    write(root, "pyproject.toml", '[tool.metrale-orch.size_budget]\nh = "lots"\n')
    code, out, err = _size(root, "size")
    assert (code, out) == (2, "")
    assert err == (
        "error: pyproject.toml [tool.metrale-orch]: size_budget.h: must be a number of "
        "bytes, or a number with K, M, G or T (powers of 1024) such as \"40M\", got 'lots'\n"
    )
    write(root, "pyproject.toml", '[tool.metrale-orch.size_budget]\nhoper = "40M"\n')
    code, out, err = _size(root, "size")
    assert (code, out) == (2, "")
    assert err.startswith(
        "error: pyproject.toml [tool.metrale-orch]: size_budget.hoper: names no hardware "
        "or target of the tree; "
    )
    with pytest.raises(UnknownBudgetKey):
        check_sizes(root, root / "build", None, {"h/m/nope": 1}, "here")


@pytest.mark.nvcc
def test_not_built_and_unreadable_targets(root: Path) -> None:
    shutil.rmtree(root / "build" / "hc")
    (root / "build" / "hf" / "m" / "q" / "tiny.fatbin").unlink()
    code, out, err = _size(root, "size")
    assert (code, err) == (1, "")
    assert "hc/m/q: not built (no build/hc/m/q/manifest.json)" in out.splitlines()
    assert "hf/m/q: build/hf/m/q/tiny.fatbin: cannot be read (" in out
    assert f"h/m/q: {_file(root, 'h/m/q', 'tiny.ptx')} B in 1 module" in out


@pytest.mark.nvcc
def test_a_fatbin_of_two_images_is_broken_down_by_arch(root: Path, tmp_path: Path) -> None:
    source = root / "kernels" / "hf" / "m" / "q" / "tiny.cu"
    fatbin = root / "build" / "hf" / "m" / "q" / "tiny.fatbin"
    run_process(
        [
            "nvcc",
            "-fatbin",
            "-gencode",
            "arch=compute_90a,code=sm_90a",
            "-gencode",
            "arch=compute_90a,code=compute_90a",
            str(source),
            "-o",
            str(fatbin),
        ],
        env=dict(os.environ),
        timeout=300,
    )
    (target,) = check_sizes(root, root / "build", "hf/*", {}, "x").report.targets
    (module,) = target.modules
    assert module.bytes == fatbin.stat().st_size
    archs = [i.arch for i in module.images]
    assert sorted(archs) == archs and len(archs) == 2
    assert archs[0].startswith("compute_90") and archs[1] == "sm_90a"
    assert sum(i.bytes for i in module.images) < module.bytes
    code, out, _ = _size(root, "size", "hf/*")
    lines = out.splitlines()
    assert lines[1].split() == ["hf/m/q", "tiny", "fatbin", str(module.bytes)]
    assert [ln.split() for ln in lines[2:4]] == [[i.arch, str(i.bytes)] for i in module.images]
    assert code == 0


@pytest.mark.nvcc
def test_an_entry_two_modules_of_a_target_export_is_a_duplicate(root: Path) -> None:
    """The same kernel installed by two modules of one target (here the PTX copied under a
    second module name): named with both modules, exit 1; the other targets are clean."""
    tdir = root / "build" / "h/m/q"
    shutil.copy(tdir / "tiny.ptx", tdir / "tiny2.ptx")
    manifest = json.loads((tdir / "manifest.json").read_text())
    (module,) = manifest["modules"]
    manifest["modules"].append(
        {**module, "artefact": "tiny2.ptx", "name": "tiny2", "stem": "tiny2"}
    )
    (tdir / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = _size(root, "size")
    assert code == 1, (out, err)
    (entry,) = check_sizes(root, root / "build", "h/m/q", {}, "x").duplicates
    assert entry[0] == "h/m/q" and entry[1].modules == ("tiny", "tiny2")
    assert (
        f"h/m/q: duplicate entry {entry[1].entry}: exported by the modules tiny, tiny2 "
        "(installed twice; a loader could get either)"
    ) in out.splitlines()
    assert out.rstrip().endswith("; 1 duplicate entries")
    assert check_sizes(root, root / "build", "hc/*", {}, "x").duplicates == ()
