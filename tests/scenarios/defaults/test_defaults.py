"""Tests for metrale_orch.defaults (SPEC 2) and `metrale-orch defaults`.

These are the tests of this topic that start processes; the others are in
``tests/unit/defaults/test_defaults_*.py``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from metrale_orch.defaults import (
    Kind,
    TargetDefaults,
    UnknownLeverError,
    defaults_from_json,
    parse_defaults,
    parse_tree_levers,
    render_defaults_header,
)
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import fake_toolchain_env, make_cache, make_config, small_tree
from tests.support.defaults import (
    GEMV_BASELINE,
    TREE,
    TREE_DEFAULTS_TOML,
    U32_MAX,
    _defines,
    hopper,
    write_levers,
)


def _probe_source(d: TargetDefaults) -> str:
    """A .cu that checks every macro against `d`, byte by byte for the strings."""
    lines = ['#include "target_defaults.h"', '#include "target_defaults.h"']
    lines.append(f'static_assert(METRALE_TARGET_SM_COUNT == {d.sm_count}, "sm_count");')

    def string_checks(macro: str, text: str) -> None:
        data = text.encode("utf-8")
        lines.append(f'static_assert(sizeof({macro}) == {len(data) + 1}, "{macro} size");')
        for i, byte in enumerate(data):
            lines.append(
                f'static_assert((unsigned char)({macro})[{i}] == {byte}u, "{macro}[{i}]");'
            )

    string_checks("METRALE_TARGET_HW", d.hw)
    device: list[str] = []
    for row, value in d.items():
        if isinstance(value, tuple):  # points: one string joined by "/"
            string_checks(row.macro, "/".join(value))
            device.append(f"(unsigned)({row.macro})[0]")
        elif row.kind is Kind.STRING:
            string_checks(row.macro, str(value))
            device.append(f"(unsigned)({row.macro})[0]")
        elif row.kind is Kind.BOOL:
            lines.append(f'static_assert({row.macro} == {int(bool(value))}, "{row.name}");')
            device.append(f"(unsigned)({row.macro})")
        else:
            lines.append(f'static_assert({row.macro} == {value}ull, "{row.name}");')
            lines.append(f'static_assert(sizeof({row.macro}) == 4, "{row.name} is 32-bit");')
            device.append(row.macro)
    lines.append('extern "C" __global__ void metrale_defaults_probe(unsigned* out) {')
    lines += [f"    out[{i}] = {expr};" for i, expr in enumerate(device)]
    lines.append("}")
    return "\n".join(lines) + "\n"


@pytest.mark.nvcc
def test_the_header_compiles_with_nvcc(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    tricky = dataclasses.replace(
        hopper(),
        hw='hop"per\\??=\u00e9',
        attn_decode_splitk='a\tb"c\\d?\n',
        lm_head_batchm_max=0,
        ffn_m16_tc=True,
        w8a8_prefill_max_m_narrowing=384,
        ffn_w4a16_tc_rows_max_m=U32_MAX,
        ffn_w4a16_bf16_tile=True,
        w8a8_gemv_entries=("mb1_ku2_o4", "mb2_ku2_o2", "mb4", "mb8_ku2_o2", "mb16_ku1_o2"),
        sm_count=U32_MAX,
    )
    tree = parse_defaults(
        "gb10", tomllib.loads(TREE_DEFAULTS_TOML), levers=parse_tree_levers(tomllib.loads(TREE))
    )
    assert tree.tree, "the tree's own levers are in the header too"
    for d in (hopper(), tricky, tree):
        (tmp_path / "target_defaults.h").write_text(render_defaults_header(d), encoding="utf-8")
        (tmp_path / "probe.cu").write_text(_probe_source(d), encoding="utf-8")
        argv = [nvcc, "--ptx", "-arch=sm_90a", "probe.cu", "-o", "probe.ptx"]
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert ".entry metrale_defaults_probe(" in (tmp_path / "probe.ptx").read_text()


def test_the_build_bakes_the_trees_levers(tmp_path: Path) -> None:

    root = small_tree(tmp_path / "repo")
    write_levers(root, TREE)
    hw = root / "kernels/hw1/HARDWARE.toml"
    hw.write_text(hw.read_text() + 'moe_entries = ["a2", "b1"]\nmoe_tc = false\n')
    env = fake_toolchain_env(tmp_path / "fakebin", tmp_path / "fake.log")
    config = make_config(root, tmp_path / "cache")
    target = Target(hardware="hw1", model="m1", quant="q1")
    result = build_target(root, target, config=config, cache=make_cache(config), environ=env)
    assert not result.failed
    out = root / "build/hw1/m1/q1"
    baked = json.loads((out / "target_defaults.json").read_text())
    assert (baked["moe_entries"], baked["moe_tc"], baked["moe_rows_max_m"]) == (
        ["a2", "b1"],
        False,
        64,
    )
    assert baked["w8a8_gemv_entries"] == list(GEMV_BASELINE)
    levers = parse_tree_levers(tomllib.loads(TREE))
    assert defaults_from_json(baked, levers=levers).value("moe_entries") == ("a2", "b1")
    defines = _defines((out / "target_defaults.h").read_text())
    assert (defines["METRALE_MOE_ENTRIES"], defines["METRALE_MOE_TC"]) == ('"a2/b1"', "0")
    assert defines["METRALE_W8A8_GEMV_ENTRIES"] == '"mb1_ku8/mb2/mb4/mb8/mb16"'

    # Without the declaration the same table is refused, naming every unknown key at once.
    (root / "kernels/LEVERS.toml").unlink()
    with pytest.raises(UnknownLeverError) as info:
        build_target(root, target, config=config, cache=make_cache(config), environ=env)
    assert info.value.keys == ("moe_entries", "moe_tc")
    assert info.value.path == "kernels/hw1/HARDWARE.toml"
