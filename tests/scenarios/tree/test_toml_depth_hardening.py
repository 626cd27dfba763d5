"""TOML nested past the parser's depth is its file's one-line error (issue 43, B5).

``tomllib`` recurses once per level of nesting, so a deep enough array or inline table
raised ``RecursionError``: ``coverage`` printed "internal error". Every TOML file the
package reads goes through :func:`metrale_orch.fsutil.parse_toml`, which makes that a
``TOMLDecodeError`` each reader already reports as its file's error (exit 2).
"""

from __future__ import annotations

from pathlib import Path

from tests.support.gate import FAMILIES, TREE, _cli
from tests.support.matrix import _write, cli, sample_tree
from tests.support.trust import write_files

DEEP = "x = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_TABLE = "x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n"


def _one_error_line(code: int, out: str, err: str, where: str) -> None:
    assert (code, out) == (2, ""), err
    assert err.startswith(f"error: {where}") and err.count("\n") == 1, err
    assert "nested too deeply" in err and "internal error" not in err


def test_coverage_with_a_deeply_nested_family_file_is_one_line_exit_2(tmp_path: Path) -> None:
    root = write_files(tmp_path, {**TREE, FAMILIES: DEEP})
    _one_error_line(*_cli(root), FAMILIES)
    write_files(root, {FAMILIES: DEEP_TABLE})
    _one_error_line(*_cli(root), FAMILIES)


def test_matrix_with_a_deeply_nested_manifest_or_runner_map_is_one_line_exit_2(
    tmp_path: Path,
) -> None:
    tree = sample_tree(tmp_path)
    _write(tree / "ci" / "runners.toml", DEEP)
    _one_error_line(*cli(tree, "hopper"), "ci/runners.toml")
    tree = sample_tree(tmp_path / "again")
    _write(tree / "kernels" / "hopper" / "HARDWARE.toml", '[hardware]\narch = "sm_90a"\n' + DEEP)
    code, out, err = cli(tree, "hopper")
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert "kernels/hopper/HARDWARE.toml" in err and "nested too deeply" in err
