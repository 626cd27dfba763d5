"""Shadow drops (SPEC 3.3.2, 4.1 ``shadowed_dropped``): the scan, the exemptions, the build.

The scan is exercised on in-memory stages (a dict of stage path -> text), the
build with the recording fake nvcc of ``tests/support/build.py``, the warning
through real ``python -m doit build`` runs, and the scanner's reading of
macros against the entry points real nvcc emits.

The tests of this topic that start processes are in
``tests/scenarios/steps/test_dropped.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch.steps.dropped import (
    MAX_INCLUDE_DEPTH,
    MAX_MACRO_HOPS,
    Drop,
    Exemptions,
    drop_warnings,
    entry_points,
    missing_kernels,
    scan_drops,
    shadow_drops,
    shadow_exemptions,
)
from metrale_orch.steps.staging import stage
from metrale_orch.tree import Target, discover
from tests.support.build import (
    write,
)
from tests.support.steps import T, _fork_tree


def points(files: dict[str, str], path: str = "r.cu", dirs: tuple[str, ...] = ()) -> list[str]:
    return sorted(entry_points(path, files.get, dirs=dirs))


# ------------------------------------------------------------------------------------ the scan


def test_global_is_a_word_followed_by_whitespace() -> None:
    src = (
        'extern "C" __global__ void plain(float* x) {}\n'
        "__global__\nvoid next_line(int n) {}\n"
        "__global__\tvoid after_tab() {}\n"
        "static __global__ void __launch_bounds__(256, 2) bounded(int n) {}\n"
        "__global__ void *pointer_named() {}\n"
        "my__global__ void glued_before() {}\n"
        "__global__void glued_after() {}\n"
        "__global___x void longer_word() {}\n"
        "__global__ void templated<int>() {}\n"
        "void host_only() {}\n"
    )
    assert points({"r.cu": src}) == [
        "after_tab", "bounded", "next_line", "plain", "pointer_named",
    ]  # fmt: skip


def test_metal_kernel_starts_a_line_and_only_in_metal() -> None:
    metal = (
        "kernel void first(device float* x) {}\n"
        "  \tkernel void indented() {}\n"
        "// kernel void commented() {}\n"
        "static kernel void mid_line() {}\n"
        "kernel_handle void not_the_word() {}\n"
        '#include "h.h"\n'
    )
    header = "kernel void from_header() {}\n"
    files = {"r.metal": metal, "h.h": header}
    assert points(files, "r.metal") == ["first", "from_header", "indented"]
    # In a CUDA root, `kernel` is an ordinary word and `__global__` the keyword.
    files = {"r.cu": metal.replace('"h.h"', '"h.cuh"'), "h.cuh": header}
    assert points(files) == []


def test_both_branches_of_every_if_count() -> None:
    src = (
        "#if defined(FAST)\n"
        "__global__ void fast_path() {}\n"
        '#include "fast.cuh"\n'
        "#elif 0\n"
        "__global__ void never() {}\n"
        "#else\n"
        "__global__ void slow_path() {}\n"
        "#endif\n"
        "#ifdef NOPE\n"
        '#  include "nope.cuh"\n'
        "#endif\n"
    )
    files = {
        "r.cu": src,
        "fast.cuh": "__global__ void fast_header() {}\n",
        "nope.cuh": "__global__ void nope_header() {}\n",
    }
    assert points(files) == ["fast_header", "fast_path", "never", "nope_header", "slow_path"]


def test_object_like_defines_expand_up_to_eight_hops() -> None:
    def chain(hops: int) -> str:
        lines = [f"#define N{i} N{i + 1}" for i in range(hops - 1)]
        lines.append(f"#define N{hops - 1} real_name")
        return "\n".join(lines) + "\n__global__ void N0() {}\n"

    assert points({"r.cu": chain(MAX_MACRO_HOPS)}) == ["real_name"]
    # One more hop than allowed: the expansion stops at the eighth name.
    assert points({"r.cu": chain(MAX_MACRO_HOPS + 1)}) == [f"N{MAX_MACRO_HOPS}"]
    # A cycle terminates; an empty or non-identifier value declares nothing.
    cyc = "#define A B\n#define B A\n__global__ void A() {}\n"
    assert points({"r.cu": cyc}) == ["A"]
    assert points({"r.cu": "#define E\n__global__ void E() {}\n"}) == []
    assert points({"r.cu": "#define E a + b\n__global__ void E() {}\n"}) == []


def test_a_name_bound_before_the_include_wins() -> None:
    files = {
        "r.cu": '#define KERNEL_NAME attn_fp8\n#include "body.cuh"\n',
        "body.cuh": (
            "#define KERNEL_NAME attn_default\n"
            "#define PAGED_CONCAT_(a, b) a##b\n#define PAGED_CONCAT(a, b) PAGED_CONCAT_(a, b)\n"
            'extern "C" __global__ void KERNEL_NAME(int* x) {}\n'
            'extern "C" __global__ void PAGED_CONCAT(KERNEL_NAME, _64)(int* x) {}\n'
        ),
    }
    assert points(files) == ["attn_fp8", "attn_fp8_64"]
    # Included alone, the header's own binding applies.
    assert points(files, "body.cuh") == ["attn_default", "attn_default_64"]


def test_kernel_declaring_macros_declare_one_kernel_per_use() -> None:
    src = (
        "#define METRALE_WYN_INSTANTIATE(K) \\\n"
        '    extern "C" __global__ void gated_delta_rule_wy##K(float* o) { \\\n'
        "        o[0] = K; \\\n"
        "    }\n"
        "METRALE_WYN_INSTANTIATE(5)\n"
        "METRALE_WYN_INSTANTIATE(16)\n"
        "NOT_METRALE_WYN_INSTANTIATE(7)\n"
        "METRALE_WYN_INSTANTIATE(1, 2)\n"
        "#define OTHER(x) (x * 2)\n"
    )
    assert points({"r.cu": src}) == ["gated_delta_rule_wy16", "gated_delta_rule_wy5"]


def test_includes_followed_eight_levels_each_file_once() -> None:
    files = {"r.cu": '#include "h1.cuh"\n'}
    for i in range(1, MAX_INCLUDE_DEPTH + 2):
        files[f"h{i}.cuh"] = f'#include "h{i + 1}.cuh"\n__global__ void level{i}() {{}}\n'
    got = points(files)
    assert got == sorted(f"level{i}" for i in range(1, MAX_INCLUDE_DEPTH + 1))
    # A cycle is read once.
    loop = {
        "r.cu": '#include "a.cuh"\n__global__ void r() {}\n',
        "a.cuh": '#include "r.cu"\n__global__ void a() {}\n',
    }
    assert points(loop) == ["a", "r"]


def test_quoted_includes_resolve_next_to_the_file_then_from_the_include_dirs() -> None:
    files = {
        "m/q/r.cu": (
            '#include "sub/near.cuh"\n#include "from_dir.cuh"\n#include <system.cuh>\n'
            '#include "/abs/outside.cuh"\n#include "../../../escapes.cuh"\n'
            '#include "nowhere.cuh"\n'
        ),
        # next to the including file (sub/), before the -I directory's namesake
        "m/q/sub/near.cuh": '#include "twin.cuh"\n',
        "m/q/sub/twin.cuh": "__global__ void near_twin() {}\n",
        "m/q/twin.cuh": "__global__ void dir_twin() {}\n",
        "inc/from_dir.cuh": "__global__ void from_dir() {}\n",
        "system.cuh": "__global__ void system_header() {}\n",
        "escapes.cuh": "__global__ void escaped() {}\n",
    }
    assert points(files, "m/q/r.cu", dirs=("m/q", "inc")) == ["from_dir", "near_twin"]
    assert points(files, "m/q/r.cu") == ["near_twin"]


def test_missing_kernels_is_common_minus_leaf() -> None:
    files = {
        "common/a.cu": "__global__ void a() {}\n__global__ void b() {}\n__global__ void c() {}\n",
        "m/q/a.cu": "__global__ void c() {}\n__global__ void d() {}\n",
        "m/q/same.cu": '#include "../../common/a.cu"\n__global__ void extra() {}\n',
    }
    assert missing_kernels("common/a.cu", "m/q/a.cu", files.get) == ("a", "b")
    # A fork that includes its common namesake drops nothing.
    assert missing_kernels("common/a.cu", "m/q/same.cu", files.get) == ()
    assert missing_kernels("common/a.cu", "m/q/gone.cu", files.get) == ("a", "b", "c")
    assert missing_kernels("common/gone.cu", "m/q/a.cu", files.get) == ()


names = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), max_size=6, unique=True)


@settings(max_examples=60, deadline=None)
@given(common=names, leaf=names, via_define=st.booleans())
def test_drops_are_exactly_the_common_kernels_the_leaf_lacks(
    common: list[str], leaf: list[str], via_define: bool
) -> None:
    def source(kernels: list[str]) -> str:
        if not via_define:
            return "".join(f'extern "C" __global__ void {k}(int* x) {{}}\n' for k in kernels)
        return "".join(
            f'#define NAME_{i} {k}\nextern "C" __global__ void NAME_{i}(int* x) {{}}\n'
            for i, k in enumerate(kernels)
        )

    files = {"common/x.cu": source(common), "m/q/x.cu": source(leaf)}
    assert missing_kernels("common/x.cu", "m/q/x.cu", files.get) == tuple(
        sorted(set(common) - set(leaf))
    )
    assert missing_kernels("common/x.cu", "common/x.cu", files.get) == ()


# ------------------------------------------------------------------------------------ exemptions


def test_exemptions_union_over_the_target_kernel_tomls() -> None:
    got = shadow_exemptions(
        [
            ("kernels/h/common/KERNEL.toml", {"shadow_exempt": {"gemm": ["a", "b"]}}),
            ("kernels/h/m/q/KERNEL.toml", {"shadow_exempt": {"gemm": ["c"], "x.y": ["d"]}}),
            ("kernels/h/m/r/KERNEL.toml", {"build": {}}),
        ]
    )
    assert got == Exemptions(
        pairs=frozenset({("gemm", "a"), ("gemm", "b"), ("gemm", "c"), ("x.y", "d")})
    )


NOT_A_NAME = "must be a kernel name (an identifier), got "


@pytest.mark.parametrize(
    ("table", "key", "problem"),
    [
        (1, "[shadow_exempt]", 'must be a table of <module> = ["<kernel>", ...]'),
        (["a"], "[shadow_exempt]", 'must be a table of <module> = ["<kernel>", ...]'),
        (
            {"gemm": "a"},
            "[shadow_exempt] gemm",
            "must be an array of kernel names, e.g. gemm = [\"gemm_fast\"], got str 'a' "
            "(quote a module name holding a dot)",
        ),
        (
            {"x": {"y": ["a"]}},  # what an unquoted `x.y = ["a"]` parses to
            "[shadow_exempt] x",
            'must be an array of kernel names, e.g. x = ["x_fast"], got a table '
            "(quote a module name holding a dot)",
        ),
        (
            {"gemm": ["a", 1]},
            "[shadow_exempt] gemm[1]",
            "must be a kernel name (an identifier), got int 1",
        ),
        (
            {"a.b": ["two words"]},
            '[shadow_exempt] "a.b"[0]',
            "must be a kernel name (an identifier), got str 'two words'",
        ),
        ({"gemm": [""]}, "[shadow_exempt] gemm[0]", f"{NOT_A_NAME}str ''"),
        ({"gemm": ["9lives"]}, "[shadow_exempt] gemm[0]", f"{NOT_A_NAME}str '9lives'"),
    ],
)  # fmt: skip
def test_malformed_exemptions_name_the_file_and_key(table: object, key: str, problem: str) -> None:
    path = "kernels/h/m/q/KERNEL.toml"
    got = shadow_exemptions([(path, {"shadow_exempt": table})])
    assert got.problems == ((path, key, problem),)


def test_every_malformed_exemption_is_reported_and_good_ones_still_count() -> None:
    got = shadow_exemptions(
        [
            ("kernels/h/common/KERNEL.toml", {"shadow_exempt": {"a": [1], "b": ["ok"]}}),
            ("kernels/h/m/q/KERNEL.toml", {"shadow_exempt": 3}),
        ]
    )
    assert got.pairs == frozenset({("b", "ok")})
    assert [(p, k) for p, k, _ in got.problems] == [
        ("kernels/h/common/KERNEL.toml", "[shadow_exempt] a[0]"),
        ("kernels/h/m/q/KERNEL.toml", "[shadow_exempt]"),
    ]


def test_warnings_name_target_module_kernel_and_files(tmp_path: Path) -> None:
    leaf = tmp_path / "kernels/h/m/q/g.cu"
    common = tmp_path / "kernels/h/common/g.cu"
    drops = [
        Drop(module="gemm.v2", kernel="b", leaf=leaf, common=common),
        Drop(module="gemm.v2", kernel="a", leaf=leaf, common=common),
    ]
    exempt = Exemptions(pairs=frozenset({("gemm.v2", "b"), ("g", "a")}))
    assert drop_warnings("h/m/q", drops, exempt, tmp_path) == (
        "h/m/q: module gemm.v2 drops kernel a: kernels/h/m/q/g.cu replaces "
        "kernels/h/common/g.cu, which defines it; if intended, list it in a KERNEL.toml: "
        '[shadow_exempt] "gemm.v2" = ["a"]',
    )


# ------------------------------------------------------------------------------------ a target

HW_TOML = '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n'


def test_shadow_drops_of_an_inheriting_target_read_its_own_stage(tmp_path: Path) -> None:
    """gb10 inherits hopper: the parent's leaf fork drops from the parent's common file,
    and an own common file of the same stem wins over it (own over parent)."""
    root = tmp_path / "repo"
    for rel, text in {
        "kernels/hopper/HARDWARE.toml": HW_TOML,
        "kernels/hopper/common/g.cu": "__global__ void g() {}\n__global__ void g_hopper() {}\n",
        "kernels/hopper/m/MODEL.toml": "[model]\n",
        "kernels/hopper/m/q/g.cu": "__global__ void g() {}\n",
        "kernels/hopper/m/q/KERNEL.toml": '[shadow]\ng = "fork"\n[modules]\ng = "gemm"\n',
        "kernels/gb10/HARDWARE.toml": HW_TOML.replace("sm_90a", "sm_121f")
        + 'inherits = "hopper"\n',
        "kernels/gb10/common/g.cu": "__global__ void g() {}\n__global__ void g_gb10() {}\n",
        "kernels/gb10/common/KERNEL.toml": '[shadow]\ng = "own common"\n',
        "kernels/gb10/m/MODEL.toml": "[model]\n",
    }.items():
        write(root, rel, text)
    found = {}
    for target in ("hopper/m/q", "gb10/m/q"):
        layout = discover(root, Target.parse(target))
        staged = stage(layout, tmp_path / "stage" / target)
        found[target] = [(d.module, d.kernel) for d in scan_drops(layout, staged, {"g": "gemm"})]
    assert found == {"hopper/m/q": [("gemm", "g_hopper")], "gb10/m/q": [("gemm", "g_gb10")]}


def test_shadow_drops_use_the_given_include_dirs(tmp_path: Path) -> None:
    root = _fork_tree(tmp_path / "repo")
    write(root, "kernels/hw1/m1/q1/scale.cu", '#include "fast.cuh"\n__global__ void scale() {}\n')
    write(root, "kernels/hw1/m1/q1/inc/fast.cuh", "__global__ void scale_fast() {}\n")
    layout = discover(root, T)
    staged = stage(layout, tmp_path / "stage")
    texts = {rel: (staged.dir / rel).read_text() for rel in staged.hashes}
    names = {"scale": "scale_q1"}
    dropped = shadow_drops(layout, names, texts.get)
    assert [(d.module, d.kernel) for d in dropped] == [("scale_q1", "scale_fast")]
    with_inc = shadow_drops(layout, names, texts.get, dirs=lambda cwd, entry: (cwd, f"{cwd}/inc"))
    assert with_inc == ()
