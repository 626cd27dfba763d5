"""The benchmark generator's real profile (``bench/gen_tree.py --profile real``).

A small version of the tree (``scale``) is generated and checked against what the
real Metrale tree looks like (NOTES.md "The real tree"): which hardware trees, vendors
and targets it has, that every target resolves to exactly the modules the generator
meant, that the format's rules hold (every shadow declared, no byte-identical files,
``check`` passes), and that the special shapes are there (cross-model includes, `use`-
heavy commons, 17 levers, the files of other tools). The full profile's module counts
are checked too (generating it takes a fraction of a second). The default profile is
pinned by a digest so earlier benchmark numbers stay comparable.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import posixpath
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from metrale_orch.cli import main
from metrale_orch.defaults import LEVERS, parse_defaults
from metrale_orch.tree import LayoutError, resolve_all, walk
from tests.support import REPO

BENCH = REPO / "bench"


def _gen_tree() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gen_tree", BENCH / "gen_tree.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


gen_tree = _gen_tree()

NVIDIA = ("gb10", "hopper", "b200", "b300")
TARGETS_PER_HW = {
    "gb10": 12,
    "hopper": 12,
    "b200": 12,
    "b300": 12,
    "strix": 5,
    "strix-hip": 5,
    "metal": 2,
}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("real-small")
    return root, gen_tree.generate_real(root, scale=0.1)


def _toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def test_hardware_trees_vendors_and_targets(small: tuple[Path, Any]) -> None:
    root, tree = small
    kernels = root / "kernels"
    vendors = {}
    for manifest in sorted(kernels.glob("*/HARDWARE.toml")):
        hardware = _toml(manifest)["hardware"]
        assert isinstance(hardware, dict)
        vendors[manifest.parent.name] = hardware["vendor"]
    assert (
        vendors
        == tree.vendors
        == {
            "b200": "nvidia",
            "b300": "nvidia",
            "gb10": "nvidia",
            "gfx1201": "hip",
            "hopper": "nvidia",
            "metal": "apple",
            "strix": "amd",
            "strix-hip": "hip",
        }
    )
    arch = {hw: _toml(kernels / hw / "HARDWARE.toml")["hardware"] for hw in vendors}
    assert {hw: t["arch"] for hw, t in arch.items()} == {
        "b200": "sm_100a",
        "b300": "sm_103a",
        "gb10": "sm_121f",
        "gfx1201": "gfx1201",
        "hopper": "sm_90a",
        "metal": "metal3.1",
        "strix": "gfx1151",
        "strix-hip": "gfx1151",
    }
    inherits = {hw: t.get("inherits") for hw, t in arch.items()}
    assert inherits == {hw: "gb10" if hw in ("hopper", "b200") else None for hw in vendors}
    assert arch["strix-hip"]["name"] == "strix"

    walked = [str(t) for t in walk(root)]
    assert sorted(walked) == sorted(tree.targets)
    assert Counter(t.split("/")[0] for t in walked) == TARGETS_PER_HW  # gfx1201: none


def test_every_target_resolves_to_the_generated_modules(small: tuple[Path, Any]) -> None:
    root, tree = small
    results = resolve_all(root)
    errors = [f"{t}: {r}" for t, r in results if isinstance(r, LayoutError)]
    assert errors == []
    for target, layout in results:
        assert not isinstance(layout, LayoutError)
        assert {stem for stem, _ in layout.modules()} == tree.targets[str(target)], target


def test_the_full_profile_has_the_real_module_counts(tmp_path: Path) -> None:
    tree = gen_tree.generate_real(tmp_path)
    counts: dict[str, list[int]] = {}
    for target, layout in resolve_all(tmp_path):
        assert not isinstance(layout, LayoutError), layout
        modules = {stem for stem, _ in layout.modules()}
        assert modules == tree.targets[str(target)]
        counts.setdefault(target.hardware, []).append(len(modules))
    assert len(tree.targets) == 60
    for hw in NVIDIA:
        assert min(counts[hw]) >= 224 and max(counts[hw]) <= 255, (hw, counts[hw])
    assert min(counts["gb10"]) == 224 and max(counts["b200"]) > 250
    for hw in ("strix", "strix-hip"):
        assert min(counts[hw]) >= 91 and max(counts[hw]) <= 96, (hw, counts[hw])
    assert counts["metal"] == [43, 43]
    # ~620 kernel files and ~167 TOML files, as the real tree.
    assert 600 <= tree.total_files - tree.files["toml"] <= 760, tree.files
    assert 150 <= tree.files["toml"] <= 180, tree.files
    assert tree.files["metal"] == 45


def test_commons_use_gb10_and_strix_kernels(small: tuple[Path, Any]) -> None:
    root, _ = small
    kernels = root / "kernels"
    for hw, reached in (
        ("b300", {"gb10"}),
        ("strix", {"gb10"}),
        ("strix-hip", {"gb10", "strix"}),
    ):
        uses = _toml(kernels / hw / "common" / "KERNEL.toml")["sources"]["use"]
        assert uses, hw
        trees = {posixpath.normpath(f"{hw}/{u}").split("/")[0] for u in uses}
        assert trees == reached, hw
    full = gen_tree.generate_real(root.parent / "real-full-uses")
    assert full.targets  # the full profile's b300 uses about 100 gb10 kernels
    b300 = root.parent / "real-full-uses" / "kernels" / "b300" / "common" / "KERNEL.toml"
    assert len(_toml(b300)["sources"]["use"]) == 100


def test_cross_model_includes_reach_another_models_files(small: tuple[Path, Any]) -> None:
    root, tree = small
    kernels = root / "kernels"
    assert len(tree.cross_includes) >= 2
    layouts = {str(t): r for t, r in resolve_all(root)}
    for rel, include in tree.cross_includes:
        source = kernels / rel
        assert f'#include "{include}"' in source.read_text()
        reached = Path(posixpath.normpath(posixpath.join(source.parent.as_posix(), include)))
        assert reached.is_file() and reached.is_relative_to(kernels)
        model = rel.split("/")[1]
        assert reached.relative_to(kernels).parts[1] != model  # another model's directory
        # ...outside the layout of the target that compiles it: the stage does not have it.
        layout = layouts[str(Path(rel).parent)]
        assert not isinstance(layout, LayoutError)
        assert reached not in set(layout.inputs()), rel


def test_every_defaults_table_declares_the_17_levers(small: tuple[Path, Any]) -> None:
    root, _ = small
    assert [name for name, _ in gen_tree.REAL_LEVERS] == [row.name for row in LEVERS]
    assert len(LEVERS) == 17
    with_table = []
    for manifest in sorted((root / "kernels").glob("*/HARDWARE.toml")):
        doc = _toml(manifest)
        hw = manifest.parent.name
        parse_defaults(hw, doc)  # raises on an unknown lever or a bad value
        if "defaults" in doc:
            with_table.append(hw)
            assert set(doc["defaults"]) == {row.name for row in LEVERS}, hw
    # Targets of hardware with a [defaults] table: 53 of 60, as in the real tree.
    assert with_table == ["b200", "b300", "gb10", "gfx1201", "hopper", "strix"]


def test_flags_as_in_the_real_tree(small: tuple[Path, Any]) -> None:
    root, _ = small
    kernels = root / "kernels"

    def flags(path: Path) -> list[str]:
        build = _toml(path).get("build", {})
        assert isinstance(build, dict)
        return list(build.get("extra_nvcc_flags", []))

    for hw in ("gb10", "b300", "strix"):
        assert flags(kernels / hw / "common" / "KERNEL.toml") == ["--fmad=false", "-DTQ_PLUS_SIGNS"]
    for hw in ("hopper", "b200", "b300"):
        assert flags(kernels / hw / "HARDWARE.toml") == ["-DMETRALE_NO_WARP_BLOCKSCALE_MMA"]
    leaves = [p for p in kernels.glob("gb10/*/*/KERNEL.toml")]
    assert all(flags(p)[0] == "--fmad=false" for p in leaves)
    assert any("-DHDIM=128" in flags(p) for p in leaves)
    assert all("-ffp-contract=off" in flags(p) for p in kernels.glob("strix*/*/*/KERNEL.toml"))


def test_files_of_other_tools_are_there_and_ignored(small: tuple[Path, Any]) -> None:
    root, _ = small
    kernels = root / "kernels"
    for rel in ("DEVICES.toml", "ASM_RATCHET.toml", "circuits/decode/CIRCUIT.toml"):
        _toml(kernels / rel)
    assert not (kernels / "circuits" / "HARDWARE.toml").exists()
    names = Counter(p.name for p in kernels.rglob("*.toml"))
    for name in ("FUSIONS.toml", "KERNEL_FAMILIES.toml", "ACCURACY.toml", "BENCH.toml"):
        assert names[name] >= 2, name
    model = _toml(kernels / "gb10" / "qwen3.6-27b" / "MODEL.toml")
    for table in ("sampling", "behavior", "model_types", "dflash", "expected_absent"):
        assert table in model, table


def test_no_two_kernel_files_are_byte_identical(small: tuple[Path, Any]) -> None:
    root, _ = small
    digests: dict[str, Path] = {}
    for path in sorted((root / "kernels").rglob("*")):
        if path.suffix in (".cu", ".cuh", ".h", ".metal"):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert digest not in digests, (path, digests.get(digest))
            digests[digest] = path
    assert len(digests) > 1, "the generated tree has kernel files to compare"


def test_check_accepts_the_tree(small: tuple[Path, Any], tmp_path: Path) -> None:
    root, _ = small
    out, err = io.StringIO(), io.StringIO()
    empty = tmp_path / "bin"
    empty.mkdir()
    code = main(["--root", str(root), "check"], environ={"PATH": str(empty)}, out=out, err=err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert "ok" in out.getvalue()


@pytest.mark.nvcc
def test_nvcc_compiles_the_generated_cuda(small: tuple[Path, Any], tmp_path: Path) -> None:
    """The NVIDIA sources are real CUDA: a common kernel (with the hardware, common and
    leaf flags) and a leaf with a cross-model include compile under ``--Werror``."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    root, tree = small
    kernels = root / "kernels"
    cross = next(rel for rel, _ in tree.cross_includes if rel.startswith("b300/"))
    common = sorted((kernels / "b300" / "common").glob("*.cu"))[0]
    flags = ["--fmad=false", "-DTQ_PLUS_SIGNS", "-DHDIM=128", "-DMETRALE_NO_WARP_BLOCKSCALE_MMA"]
    out = tmp_path / "out.ptx"
    for source in (common, kernels / cross):
        argv = [nvcc, "--ptx", "-arch=sm_103a", "-O3", *flags, "--Werror", "all-warnings"]
        done = subprocess.run(
            [*argv, "-I.", source.name, "-o", str(out)],
            cwd=source.parent,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert f".entry {source.stem}(" in out.read_text()


def test_the_default_profile_is_unchanged(tmp_path: Path) -> None:
    """A digest of a small default-profile tree, taken before the real profile existed."""
    n = gen_tree.generate(tmp_path, hardware=2, overlays=2, models=3, quants=3, files=6, seed=7)
    h = hashlib.sha256()
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    for path in files:
        h.update(path.relative_to(tmp_path).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    assert (n, len(files)) == (36, 203)
    assert h.hexdigest() == "433ff394cb51a2a6fe1afdf03ca3fd1c53665e3ccfb6e001328684a687e24ac3"
