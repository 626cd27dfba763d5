"""Conformance tests for SPEC section 1: ``MODEL.toml`` and ``KERNEL.toml`` (the rest of section 1
is in the other ``tests/unit/tree/test_layout_*.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.tree import (
    ManifestError,
    RedirectError,
    Target,
    discover,
    kernel_manifest,
    kernel_source_dir,
    supports_quant,
    walk,
)
from tests.support.tree import T, files, hw, kernel_toml, model, overlay, plain, write

# --------------------------------------------------------------------------- MODEL.toml


def redirect_tree(root: Path, value: object) -> None:
    hw(root, "h")
    model(root, "h", "alias", kernel_source=value)
    files(root, "kernels/h/alias/q/x.cu", "kernels/h/common/c.cu")


def test_redirect(tmp_path: Path) -> None:
    redirect_tree(tmp_path, "base")
    model(tmp_path, "h", "base")
    files(tmp_path, "kernels/h/base/q/b.cu")
    lay = discover(tmp_path, T("h/alias/q"))
    assert lay.source_model == "base"
    assert lay.model_dir == tmp_path / "kernels/h/alias"
    assert lay.layers[0].dir == tmp_path / "kernels/h/base/q"
    assert list(lay.leaf) == ["b.cu"]
    assert kernel_source_dir(tmp_path / "kernels/h/alias") == tmp_path / "kernels/h/base"
    assert kernel_source_dir(tmp_path / "kernels/h/base") == tmp_path / "kernels/h/base"


def test_no_redirect(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu")
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.source_model == "m"
    assert lay.model_dir == tmp_path / "kernels/h/m"


@pytest.mark.parametrize("value", [1, True, ["base"], "", "   ", "\t"])
def test_kernel_source_bad_value(tmp_path: Path, value: object) -> None:
    redirect_tree(tmp_path, value)
    model(tmp_path, "h", "base")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/alias/q"))
    assert ei.value.key is not None and "kernel_source" in ei.value.key
    assert ei.value.path == tmp_path / "kernels/h/alias/MODEL.toml"
    assert "kernels/h/alias/MODEL.toml" in str(ei.value)
    with pytest.raises(ManifestError):
        kernel_source_dir(tmp_path / "kernels/h/alias")


def test_model_toml_bad_toml(tmp_path: Path) -> None:
    hw(tmp_path, "h")
    model(tmp_path, "h", "m", raw="[model\n")
    files(tmp_path, "kernels/h/m/q/x.cu")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/m/MODEL.toml" in str(ei.value)


@pytest.mark.parametrize("case", ["missing", "file", "no_model_toml", "chain", "self", "to_self"])
def test_redirect_errors(tmp_path: Path, case: str) -> None:
    hw(tmp_path, "h")
    files(tmp_path, "kernels/h/alias/q/x.cu", "kernels/h/common/c.cu")
    value = "base"
    if case == "file":
        write(tmp_path, "kernels/h/base", "not a dir")
    elif case == "no_model_toml":
        files(tmp_path, "kernels/h/base/q/b.cu")
    elif case == "chain":
        model(tmp_path, "h", "base", kernel_source="third")
        model(tmp_path, "h", "third")
    elif case == "self":
        model(tmp_path, "h", "base", kernel_source="base")
    elif case == "to_self":
        value = "alias"
    model(tmp_path, "h", "alias", kernel_source=value)
    with pytest.raises(RedirectError) as ei:
        discover(tmp_path, T("h/alias/q"))
    assert ei.value.path == tmp_path / "kernels/h/alias/MODEL.toml"
    assert ei.value.model_dir == tmp_path / "kernels/h/alias"
    assert ei.value.referent == tmp_path / "kernels/h" / value
    assert "kernels/h/alias/MODEL.toml" in str(ei.value)
    with pytest.raises(RedirectError):
        kernel_source_dir(tmp_path / "kernels/h/alias")


def test_redirect_referent_not_normalised(tmp_path: Path) -> None:
    # the referent is <hw dir>/<value> as written; "./base" names the same directory
    hw(tmp_path, "h")
    model(tmp_path, "h", "alias", kernel_source="./base")
    model(tmp_path, "h", "base")
    files(tmp_path, "kernels/h/base/q/b.cu")
    lay = discover(tmp_path, T("h/alias/q"))
    assert lay.layers[0].dir == tmp_path / "kernels/h/./base/q"
    assert list(lay.leaf) == ["b.cu"]


def allow_tree(root: Path, quants: object, *, source_quants: object = None) -> None:
    hw(root, "h")
    if source_quants is None:
        model(root, "h", "m", supported_quants=quants)
    else:
        model(root, "h", "m", supported_quants=quants, kernel_source="s")
        model(root, "h", "s", supported_quants=source_quants)
        files(root, "kernels/h/s/q/y.cu")
    files(root, "kernels/h/m/q/x.cu", "kernels/h/common/c.cu")


def test_allow_list_absent_every_quant_resolves_even_common_only(tmp_path: Path) -> None:
    allow_tree(tmp_path, None)
    lay = discover(tmp_path, T("h/m/nothing-here"))
    assert dict(lay.leaf) == {}
    assert list(lay.common) == ["c.cu"]


def test_allow_list_listed(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["a", "q"])
    assert list(discover(tmp_path, T("h/m/q")).leaf) == ["x.cu"]
    assert supports_quant(tmp_path / "kernels/h/m", "q")
    assert not supports_quant(tmp_path / "kernels/h/m", "b")


@pytest.mark.parametrize("quant", ["b", "Q", " q", "q "])
def test_allow_list_quant_not_listed(tmp_path: Path, quant: str) -> None:
    allow_tree(tmp_path, ["a", "q"])
    files(tmp_path, f"kernels/h/m/{quant}/z.cu")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, Target(hardware="h", model="m", quant=quant))
    msg = str(ei.value)
    assert "not supported" in msg
    assert "no common-only fallback" in msg
    assert "kernels/h/m/MODEL.toml" in msg
    assert ei.value.path == tmp_path / "kernels/h/m/MODEL.toml"


@pytest.mark.parametrize(
    "raw",
    [
        "[]",
        '"q"',
        '["q", ""]',
        '["q", "  "]',
        '["q", 1]',
        '["q", ["a"]]',
        "1",
        "{ q = 1 }",
    ],
)
def test_allow_list_malformed(tmp_path: Path, raw: str) -> None:
    hw(tmp_path, "h")
    model(tmp_path, "h", "m", raw=f"[model]\nsupported_quants = {raw}\n")
    files(tmp_path, "kernels/h/m/q/x.cu")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert ei.value.key is not None and "supported_quants" in ei.value.key
    assert "kernels/h/m/MODEL.toml" in str(ei.value)
    assert "supported_quants" in str(ei.value)


def test_allow_list_redirect_source_must_allow(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["q"], source_quants=["other"])
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/s/MODEL.toml" in str(ei.value)
    assert "not supported" in str(ei.value)


def test_allow_list_model_checked_before_source(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["other"], source_quants=["other2"])
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/m/MODEL.toml" in str(ei.value)
    assert "kernels/h/s/MODEL.toml" not in str(ei.value)


def test_allow_list_source_malformed(tmp_path: Path) -> None:
    allow_tree(tmp_path, None, source_quants=[])
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/s/MODEL.toml" in str(ei.value)


def test_allow_list_both_allow(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["q"], source_quants=["q"])
    assert list(discover(tmp_path, T("h/m/q")).leaf) == ["y.cu"]


def test_walk_ignores_allow_list(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["a"])
    files(tmp_path, "kernels/h/m/b/z.cu")
    assert [str(t) for t in walk(tmp_path)] == ["h/m/b", "h/m/q"]


def test_supports_quant_without_list(tmp_path: Path) -> None:
    plain(tmp_path)
    assert supports_quant(tmp_path / "kernels/h/m", "anything")


# --------------------------------------------------------------------------- KERNEL.toml


def test_kernel_manifest_parse(tmp_path: Path) -> None:
    write(
        tmp_path,
        "d/KERNEL.toml",
        '[sources]\nuse = ["a.cu", "b.cuh"]\n[shadow]\nx = "  because  "\n"a.b" = "r"\n'
        '[build]\nflags = ["-O3"]\n[modules]\nx = 1\n[shadow_exempt]\ny = 2\n',
    )
    got = kernel_manifest(tmp_path / "d")
    assert got is not None
    assert got.path == tmp_path / "d/KERNEL.toml"
    assert tuple(got.uses) == ("a.cu", "b.cuh")
    assert dict(got.shadow) == {"x": "  because  ", "a.b": "r"}
    assert kernel_manifest(tmp_path / "nowhere") is None
    (tmp_path / "e").mkdir()
    assert kernel_manifest(tmp_path / "e") is None


def test_kernel_manifest_empty_file(tmp_path: Path) -> None:
    write(tmp_path, "d/KERNEL.toml", "")
    got = kernel_manifest(tmp_path / "d")
    assert got is not None
    assert tuple(got.uses) == () and dict(got.shadow) == {}


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("sources = 1\n", "sources"),
        ('sources = ["a.cu"]\n', "sources"),
        ('[sources]\nuse = []\nextra = "x"\n', "sources"),
        ('[sources]\nuse = "a.cu"\n', "use"),
        ('[sources]\nuse = { a = "b" }\n', "use"),
        ('[sources]\nuse = ["a.cu", 1]\n', "use"),
        ('[sources]\nuse = [["a.cu"]]\n', "use"),
        ('shadow = "x"\n', "shadow"),
        ('shadow = ["x"]\n', "shadow"),
        ("[shadow]\nx = 1\n", "shadow"),
        ("[shadow]\nx = true\n", "shadow"),
        ('[shadow]\nx = ["r"]\n', "shadow"),
        ('[shadow]\nx = ""\n', "shadow"),
        ('[shadow]\nx = "   "\n', "shadow"),
        ('[shadow]\nx = "\\t\\n"\n', "shadow"),
        ("[shadow.x]\nreason = 'r'\n", "shadow"),
    ],
)
def test_kernel_manifest_errors(tmp_path: Path, raw: str, key: str) -> None:
    plain(tmp_path)
    write(tmp_path, "kernels/h/m/q/KERNEL.toml", raw)
    with pytest.raises(ManifestError) as ei:
        kernel_manifest(tmp_path / "kernels/h/m/q")
    assert ei.value.path == tmp_path / "kernels/h/m/q/KERNEL.toml"
    assert key in str(ei.value)
    assert "kernels/h/m/q/KERNEL.toml" in str(ei.value)
    with pytest.raises(ManifestError):
        discover(tmp_path, T("h/m/q"))


def test_kernel_manifest_bad_toml(tmp_path: Path) -> None:
    plain(tmp_path)
    write(tmp_path, "kernels/h/common/KERNEL.toml", "[shadow\n")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/common/KERNEL.toml" in str(ei.value)


def test_kernel_manifest_other_tables_ignored(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu")
    write(
        tmp_path,
        "kernels/h/m/q/KERNEL.toml",
        '[build]\nnvcc = ["-lineinfo"]\n[modules]\nx = "y"\n[shadow_exempt]\nz = 3\n'
        "[anything]\nelse = 1\n",
    )
    lay = discover(tmp_path, T("h/m/q"))
    assert list(lay.configs()) == [tmp_path / "kernels/h/m/q/KERNEL.toml"]
    assert list(lay.leaf) == ["x.cu"]


def test_shadow_reason_kept_untrimmed(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/c/m/q/x.cu", "kernels/p/m/q/x.cu")
    kernel_toml(tmp_path, "kernels/c/m/q", shadow={"x": "  faster on c \n"})
    lay = discover(tmp_path, T("c/m/q"))
    assert [s.reason for s in lay.shadows] == ["  faster on c \n"]
