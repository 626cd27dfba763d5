"""Planning and building one target (SPEC 3.3, 3.4 key side, 4.1) with a recording fake nvcc.

These are the tests of this topic that run in-process; the others are in
``tests/scenarios/steps/test_compile.py``.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch.steps.errors import BuildConfigError, ToolchainMissing
from metrale_orch.steps.includes import (
    EdgeMemo,
    Includes,
    include_dirs,
    parse_includes,
    resolve_closure,
)
from metrale_orch.steps.plan import plan_target
from metrale_orch.toolchain.definitions import builtin_toolchains
from metrale_orch.toolchain.locate import find_program
from metrale_orch.tree import Target, discover
from tests.support.build import (
    small_tree,
    write,
)
from tests.support.steps import T, _build


def _plan(root: Path, target: Target = T, environ: dict[str, str] | None = None) -> Any:
    return plan_target(
        root, discover(root, target), builtin_toolchains(), identity="fake 1.0", environ=environ
    )


# ------------------------------------------------------------------------------------ plan


def test_flags_merge_in_configs_order_dropping_duplicates(tmp_path: Path) -> None:
    small_tree(tmp_path)
    assert _plan(tmp_path).flags == ("-DA=1", "-DX", "-DB=1", "-DC=1")


def test_flags_of_an_inheriting_tree(tmp_path: Path) -> None:
    small_tree(
        tmp_path,
        {
            "kernels/hw2/HARDWARE.toml": (
                '[hardware]\narch = "sm_100a"\ninherits = "hw1"\n'
                '[build]\nextra_nvcc_flags = ["-DH2"]\n'
            ),
            "kernels/hw2/common/KERNEL.toml": '[build]\nextra_nvcc_flags = ["-DC2", "-DH2"]\n',
            "kernels/hw2/m1/MODEL.toml": "[model]\n",
        },
    )
    plan = _plan(tmp_path, Target(hardware="hw2", model="m1", quant="q1"))
    # Own HARDWARE.toml only (not hw1's), then parent common, own common, parent leaf.
    assert plan.flags == ("-DH2", "-DB=1", "-DA=1", "-DC2", "-DC=1")
    assert plan.arch == "sm_100a"


@pytest.mark.parametrize(
    ("rel", "text", "key"),
    [
        ("kernels/hw1/m1/q1/KERNEL.toml", '[build]\nextra_nvcc_flags = ["-DA", 3]\n',
         "[build] extra_nvcc_flags[1]"),
        ("kernels/hw1/common/KERNEL.toml", '[build]\nextra_nvcc_flags = "-DA"\n',
         "[build] extra_nvcc_flags"),
        ("kernels/hw1/common/KERNEL.toml", 'build = 1\n', "[build]"),
        ("kernels/hw1/common/KERNEL.toml", '[modules]\nadd = "a/b"\n', "[modules] add"),
        ("kernels/hw1/common/KERNEL.toml", '[modules]\nadd = "leaf"\n', "[modules] add"),
    ],
)  # fmt: skip
def test_bad_build_settings_name_file_and_key(
    tmp_path: Path, rel: str, text: str, key: str
) -> None:
    small_tree(tmp_path, {rel: text})
    with pytest.raises(BuildConfigError) as err:
        _plan(tmp_path)
    assert err.value.path == rel
    assert err.value.key == key
    assert rel in str(err.value)


def test_missing_arch_is_a_build_error(tmp_path: Path) -> None:
    small_tree(tmp_path, {"kernels/hw1/HARDWARE.toml": '[hardware]\nvendor = "nvidia"\n'})
    with pytest.raises(BuildConfigError, match=r"HARDWARE.toml: \[hardware\] arch: is required"):
        _plan(tmp_path)


def test_renames_more_specific_wins(tmp_path: Path) -> None:
    small_tree(tmp_path)
    names = {m.stem: m.name for m in _plan(tmp_path).modules}
    assert names == {"add": "vector_add", "leaf": "leaf", "scale": "scale_q1"}
    write(
        tmp_path,
        "kernels/hw1/m1/q1/KERNEL.toml",
        '[modules]\nadd = "add_q1"\n',
    )
    names = {m.stem: (m.name, m.artefact) for m in _plan(tmp_path).modules}
    assert names["add"] == ("add_q1", "add_q1.ptx")
    assert names["scale"] == ("scale", "scale.ptx")


def test_argv_is_relative_and_machine_independent(tmp_path: Path) -> None:
    small_tree(tmp_path)
    mods = {m.stem: m for m in _plan(tmp_path).modules}
    assert mods["add"].argv == (
        "nvcc", "--ptx", "-arch=sm_90a", "-O3", "-DA=1", "-DX", "-DB=1", "-DC=1", "-I.",
        "--Werror", "all-warnings", "add.cu", "-o", "vector_add.ptx",
    )  # fmt: skip
    assert (mods["add"].cwd, mods["add"].staged, mods["add"].role) == (
        "common", "common/add.cu", "common",
    )  # fmt: skip
    assert (mods["leaf"].cwd, mods["leaf"].staged, mods["leaf"].role) == (
        "m1/q1", "m1/q1/leaf.cu", "leaf",
    )  # fmt: skip


def test_file_deps_and_signature(tmp_path: Path) -> None:
    small_tree(tmp_path, {"kernels/hw1/common/vendor/v.h": "// v\n"})
    plan = _plan(tmp_path, environ={"NVCC_PREPEND_FLAGS": "-G", "UNRELATED": "x"})
    rels = [p.relative_to(tmp_path).as_posix() for p in plan.file_deps]
    assert rels == sorted(rels)
    assert set(rels) == {
        "kernels/hw1/HARDWARE.toml", "kernels/hw1/m1/MODEL.toml",
        "kernels/hw1/common/KERNEL.toml", "kernels/hw1/m1/q1/KERNEL.toml",
        "kernels/hw1/common/add.cu", "kernels/hw1/common/scale.cu",
        "kernels/hw1/common/util.cuh", "kernels/hw1/common/deep.cuh",
        "kernels/hw1/common/unrelated.cuh", "kernels/hw1/common/vendor/v.h",
        "kernels/hw1/m1/q1/leaf.cu",
    }  # fmt: skip
    text = json.dumps(dict(plan.signature), sort_keys=True)
    assert str(tmp_path) not in text
    sig = json.loads(text)
    assert sig["toolchain"]["identity"] == "fake 1.0"
    assert sig["env"] == {"NVCC_PREPEND_FLAGS": "-G"}
    assert sig["layout"]["common"]["add.cu"] == "kernels/hw1/common/add.cu"
    assert sig["defaults"]["lm_head_batchm_max"] == 12
    assert [m["name"] for m in sig["modules"]] == ["vector_add", "leaf", "scale_q1"]


# ------------------------------------------------------------------------------------ includes


def test_parse_includes_reads_every_branch() -> None:
    src = b"""#include "a.cuh"
#if 0
#  include "b.cuh"
#else
  #include <c.h>
#endif
// #include "d.cuh"
#if __has_include("e.cuh")
#endif
"""
    inc = parse_includes(src)
    # A line comment is not an include; every preprocessor branch is.
    assert inc.quoted == ("a.cuh", "b.cuh", "e.cuh")
    assert inc.angled == ("c.h",)
    assert not inc.computed
    assert parse_includes(b"#include HEADER_NAME\n").computed


def test_resolve_closure_order_and_bounds() -> None:
    staged = dict.fromkeys(
        ["common/a.cu", "common/a.cuh", "common/sub/b.cuh", "m/q/a.cuh", "m/q/x.cu", "other.cuh"],
        "h",
    )
    includes = {
        "m/q/x.cu": Includes(
            quoted=("a.cuh", "../../common/sub/b.cuh", "../../../escape.cuh", "cuda_fp16.h"),
            angled=("a.cuh",),
        ),
        "common/sub/b.cuh": Includes(quoted=("../a.cuh",)),
    }
    # Quoted: the including file's dir first (m/q/a.cuh), then -I; angled: -I only, the
    # flags' -I before the role directory's -I. (their order on the command line).
    dirs = include_dirs("m/q", ["-I../../common", "-I/abs/ignored"])
    assert dirs == ("common", "m/q")
    closure = resolve_closure(["m/q/x.cu"], staged=staged, includes_of=includes, dirs=dirs)
    assert closure == ("common/a.cuh", "common/sub/b.cuh", "m/q/a.cuh", "m/q/x.cu")
    # A computed include anywhere makes the closure every staged file.
    includes["common/a.cuh"] = Includes(computed=True)
    closure = resolve_closure(["m/q/x.cu"], staged=staged, includes_of=includes, dirs=dirs)
    assert closure == tuple(sorted(staged))


_NAMES = ["x.cu", "a.cuh", "b.cuh", "sub/c.cuh", "../a.cuh", "missing.cuh"]
_FILES = ["x.cu", "a.cuh", "b.cuh", "sub/c.cuh"]


@settings(max_examples=60, deadline=None)
@given(
    graph=st.dictionaries(
        st.sampled_from(_FILES), st.lists(st.sampled_from(_NAMES), max_size=4), max_size=4
    )
)
def test_closure_laws(graph: dict[str, list[str]]) -> None:
    staged = dict.fromkeys(_FILES, "h")
    includes = {f: Includes(quoted=tuple(names)) for f, names in graph.items()}
    closure = resolve_closure(["x.cu"], staged=staged, includes_of=includes, dirs=("",))
    assert "x.cu" in closure
    # Closed: every include of a member that names a staged file leads into the closure.
    for member in closure:
        for name in includes.get(member, Includes()).quoted:
            here = posixpath.normpath(posixpath.join(posixpath.dirname(member), name))
            if here in staged:
                assert here in closure
    # An added file nobody names changes nothing.
    more = resolve_closure(
        ["x.cu"], staged={**staged, "new.cuh": "h"}, includes_of=includes, dirs=("",)
    )
    assert more == closure


@settings(max_examples=60, deadline=None)
@given(
    graph=st.dictionaries(
        st.sampled_from(_FILES), st.lists(st.sampled_from(_NAMES), max_size=4), max_size=4
    ),
    angled=st.dictionaries(st.sampled_from(_FILES), st.sampled_from(_NAMES), max_size=2),
    computed=st.sets(st.sampled_from(_FILES), max_size=1),
)
def test_a_memo_of_resolved_includes_changes_no_closure(
    graph: dict[str, list[str]], angled: dict[str, str], computed: set[str]
) -> None:
    # One target's modules share the memo: every closure is what a fresh resolution gives,
    # whatever was resolved before it, under each search path (the memo is kept per path).
    staged = dict.fromkeys(_FILES, "h")
    includes = {
        f: Includes(
            quoted=tuple(graph.get(f, ())),
            angled=(angled[f],) if f in angled else (),
            computed=f in computed,
        )
        for f in _FILES
    }
    memo: EdgeMemo = {}
    for dirs in [("",), ("sub",), ("",)]:
        for root in _FILES:
            fresh = resolve_closure([root], staged=staged, includes_of=includes, dirs=dirs)
            kept = resolve_closure(
                [root], staged=staged, includes_of=includes, dirs=dirs, memo=memo
            )
            assert kept == fresh, (root, dirs)


def test_missing_toolchain_raises_with_install_hint(tmp_path: Path) -> None:
    if find_program(builtin_toolchains()["nvcc"], {"PATH": str(tmp_path)}) is not None:
        pytest.skip("this Python has nvcc from pip (metrale-orch[cuda]); it cannot be missing")
    root = small_tree(tmp_path / "repo")
    with pytest.raises(ToolchainMissing, match="pip install 'metrale-orch\\[cuda\\]'"):
        _build(root, {"PATH": str(tmp_path / "nothing")}, tmp_path / "cache")
