"""Includes beyond the layout (SPEC 3.3.1): cross-model includes, escapes, the mirror.

The tests of this topic that start processes are in ``tests/scenarios/tree/test_beyond.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.steps.staging import beyond_layout, stage
from metrale_orch.tree import Target, discover, resolve_all
from metrale_orch.tree.beyond import TREE_DIR, IncludeMemo, layer_include, quoted_includes
from tests.support.tree import KQUANT, _tree


def test_quoted_includes_with_lines_and_forms() -> None:
    text = (
        b'#include "a.h"\n%:include "b.h"\n#inc\\\nlude "c.h"\n'
        b'/* x */ # include "d.h"\n#include <e.h>\n'
    )
    assert quoted_includes(text) == ((1, "a.h"), (2, "b.h"), (3, "c.h"), (4, "d.h"))


def test_cross_model_include_is_found_and_mirrored(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    layout = discover(root, Target.parse("gb10/dsv4/nvfp4"))
    beyond = beyond_layout(root, layout)
    assert beyond.errors == ()
    assert sorted(beyond.files) == [
        "gb10/qwen/nvfp4/q4k_vendor/mma.cuh",
        "gb10/qwen/nvfp4/q4k_vendor/sib.cuh",
    ]
    extra = {rel: path for rel, path in beyond.files.items()}
    staged = stage(layout, tmp_path / "stage", extra)
    assert f"{TREE_DIR}/gb10/qwen/nvfp4/q4k_vendor/mma.cuh" in staged.hashes
    # The module's -I makes the include's own spelling find the mirrored copy.
    inc = layer_include("dsv4/nvfp4", "gb10/dsv4/nvfp4")
    found = (
        tmp_path / "stage/dsv4/nvfp4" / inc / "../../../gb10/qwen/nvfp4/q4k_vendor/mma.cuh"
    ).resolve()
    assert found == (tmp_path / "stage" / TREE_DIR / "gb10/qwen/nvfp4/q4k_vendor/mma.cuh").resolve()
    assert found.read_text() == (root / "kernels/gb10/qwen/nvfp4/q4k_vendor/mma.cuh").read_text()
    # Dropping the include drops the mirror on the next staging.
    staged = stage(layout, tmp_path / "stage", {})
    assert not any(k.startswith(TREE_DIR) for k in staged.hashes)


@pytest.mark.parametrize(
    ("include", "line"),
    [("../../../../outside.cuh", 2), ("ABS", 2)],
    ids=["dotdot", "absolute"],
)
def test_include_escaping_kernels_is_an_error_naming_file_and_line(
    tmp_path: Path, include: str, line: int
) -> None:
    outside = tmp_path / "outside.cuh"
    outside.write_text("#define MMA 1\n")
    spelled = str(outside) if include == "ABS" else include
    root = _tree(
        tmp_path,
        {"kernels/gb10/dsv4/nvfp4/kquant.cu": f'// k\n#include "{spelled}"\n' + KQUANT},
    )
    beyond = beyond_layout(root, discover(root, Target.parse("gb10/dsv4/nvfp4")))
    assert len(beyond.errors) == 1
    err = beyond.errors[0]
    assert (err.where, err.line) == ("kernels/gb10/dsv4/nvfp4/kquant.cu", line)
    assert "outside kernels/" in str(err) and str(err).startswith(
        f"kernels/gb10/dsv4/nvfp4/kquant.cu:{line}:"
    )


def test_an_include_resolving_nowhere_is_left_to_the_compiler(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    beyond = beyond_layout(root, discover(root, Target.parse("gb10/qwen/nvfp4")))
    assert beyond.files == {} and beyond.errors == ()


def test_a_shared_memo_reuses_a_walk_only_where_the_stage_answers_alike(tmp_path: Path) -> None:
    """gb10's common ``k.cu`` includes ``extra.cuh``: gb10 stages none (left to the
    compiler), hopper (inheriting gb10) stages its own, which escapes kernels/. One memo
    across all targets (as ``check`` shares it) gives each target what a fresh one gives,
    so hopper's targets report the escape and gb10's do not."""
    outside = tmp_path / "outside.cuh"
    outside.write_text("#define X 1\n")
    root = _tree(
        tmp_path / "proj",
        {
            "kernels/gb10/common/k.cu": '#include "extra.cuh"\nextern "C" __global__ void k() {}\n',
            "kernels/hopper/HARDWARE.toml": (
                '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\ninherits = "gb10"\n'
            ),
            "kernels/hopper/common/extra.cuh": '#include "../../../../outside.cuh"\n',
            "kernels/hopper/qwen/MODEL.toml": "[model]\n",
        },
    )
    memo = IncludeMemo(root / "kernels", lambda p: p.read_bytes())
    targets = [t for t, _ in resolve_all(root)]
    assert [str(t) for t in targets] == ["gb10/dsv4/nvfp4", "gb10/qwen/nvfp4", "hopper/qwen/nvfp4"]
    escapes = {}
    for target in targets:
        layout = discover(root, target)
        shared, fresh = beyond_layout(root, layout, memo=memo), beyond_layout(root, layout)
        assert shared.files == fresh.files, target
        assert [str(e) for e in shared.errors] == [str(e) for e in fresh.errors], target
        escapes[str(target)] = [e.where for e in shared.errors]
    assert escapes == {
        "gb10/dsv4/nvfp4": [],
        "gb10/qwen/nvfp4": [],
        "hopper/qwen/nvfp4": ["kernels/hopper/common/extra.cuh"],
    }
