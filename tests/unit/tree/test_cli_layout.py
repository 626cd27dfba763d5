"""``metrale-orch layout`` and ``metrale-orch check`` as a user runs them.

The tests of this topic that start processes are in
``tests/scenarios/tree/test_cli_layout.py``.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from metrale_orch.cli import main
from metrale_orch.tree import discover, dump, manifest_warnings, read_manifest_warnings
from tests.support.tree import hw, kernel_toml, model, tree, write


def fake_path(root: Path) -> dict[str, str]:
    """An environment whose PATH finds an ``nvcc`` that must never run: running it leaves
    ``ran-nvcc`` beside the root. Its host compiler is not on PATH, so the build skips its
    targets without running it, and ``check``, finding it as the build does, lists them
    (:func:`skipped`)."""
    bindir = root.parent / f"{root.name}-bin"
    bindir.mkdir(exist_ok=True)
    nvcc = bindir / "nvcc"
    nvcc.write_text(f"#!/bin/sh\ntouch '{root.parent / 'ran-nvcc'}'\nexit 1\n")
    nvcc.chmod(0o755)
    return {"PATH": str(bindir)}


def skipped(*targets: str) -> str:
    """The line ``check`` lists ``targets`` with: the build skips them under :func:`fake_path`."""
    return (
        "skipped: toolchain 'nvcc' is not installed: its host compiler `gcc` was not found; "
        f"install a host C++ compiler (gcc) on PATH [target {', '.join(targets)}]"
    )


def run(root: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *argv], environ=fake_path(root), out=out, err=err)
    assert not (root.parent / "ran-nvcc").exists()
    return code, out.getvalue(), err.getvalue()


def test_layout_view_names_layers_entries_modules_shadows(tmp_path: Path) -> None:
    tree(tmp_path)
    code, out, err = run(tmp_path, "layout", "hopper/qwen/bf16")
    assert (code, err) == (0, "")
    assert "hardware hopper: vendor nvidia, arch sm_90a, inherits gb10" in out
    assert "0 leaf   own    kernels/hopper/qwen/bf16  (missing)" in out
    assert "1 leaf   parent kernels/gb10/qwen/bf16  (exists)  KERNEL.toml" in out
    assert "extra.cu  kernels/shared/extra.cu  (layer 1)  [use]" in out
    assert "vendor/  kernels/gb10/common/vendor  (subdirectory)" in out
    assert "rms    kernels/gb10/qwen/bf16/rms.cu  (leaf)" in out
    assert (
        "common util.cuh: kernels/hopper/common/util.cuh replaces "
        "kernels/gb10/common/util.cuh -- wider loads"
    ) in out


def test_layout_json_is_the_dump_format(tmp_path: Path) -> None:
    tree(tmp_path)
    code, out, _ = run(tmp_path, "layout", "--json", "hopper/qwen/bf16")
    assert code == 0
    whole = dump(tmp_path)
    assert json.loads(out) == {"hopper/qwen/bf16": whole["hopper/qwen/bf16"]}
    code, out, _ = run(tmp_path, "layout", "--json")
    assert code == 0 and json.loads(out) == whole
    assert str(tmp_path) not in out  # root-relative paths only


def test_layout_of_a_broken_target_is_one_line_and_exit_2(tmp_path: Path) -> None:
    tree(tmp_path)
    write(tmp_path, "kernels/hopper/qwen/bf16/rms.cu")  # undeclared own-over-parent win
    code, out, err = run(tmp_path, "layout", "hopper/qwen/bf16")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: kernels/hopper/qwen/bf16/rms.cu shadows")
    assert '[shadow] rms = "<reason>"' in err
    code, out, _ = run(tmp_path, "layout", "--json", "hopper/qwen/bf16")
    assert code == 2 and "shadows" in json.loads(out)["hopper/qwen/bf16"]["error"]
    code, _, err = run(tmp_path, "--debug", "layout", "hopper/qwen/bf16")
    assert code == 2 and "Traceback" in err


def test_layout_rejects_a_malformed_target(tmp_path: Path) -> None:
    tree(tmp_path)
    code, _, err = run(tmp_path, "layout", "hopper/qwen")
    assert code == 2 and "expected hw/model/quant" in err


def test_layout_without_target_lists_every_target(tmp_path: Path) -> None:
    tree(tmp_path)
    code, out, _ = run(tmp_path, "layout")
    assert code == 0
    assert out.splitlines() == [
        "gb10/qwen/bf16  2 modules",
        "hopper/qwen/bf16  2 modules",
        "2 targets, 0 failing",
    ]


def test_check_clean_tree(tmp_path: Path) -> None:
    tree(tmp_path)
    code, out, err = run(tmp_path, "check")
    assert (code, err) == (0, skipped("gb10/qwen/bf16", "hopper/qwen/bf16") + "\n")
    assert out == "check: ok (the build accepts all 2 targets; 2 skipped: cannot be built here)\n"


def test_check_reports_every_problem_at_once(tmp_path: Path) -> None:
    tree(tmp_path)
    # 1. an undeclared win in hopper's leaf (breaks one target)
    write(tmp_path, "kernels/hopper/qwen/bf16/rms.cu", "// a hopper variant\n")
    # 2. a pointless fork: the declared hopper util.cuh is byte-identical to gb10's
    write(tmp_path, "kernels/hopper/common/util.cuh", "// kernels/gb10/common/util.cuh\n")
    # 3. the same file, same bytes, in two unrelated places
    write(tmp_path, "kernels/gb10/common/copy/extra.cu", "// kernels/shared/extra.cu\n")
    # 4. a symlink that no target reads
    os.symlink("nowhere", tmp_path / "kernels/shared/link.cu")
    # A second hopper model still resolves, so the fork (2) is seen through it.
    model(tmp_path, "hopper", "llama")
    write(tmp_path, "kernels/hopper/llama/bf16/attn.cu")
    code, out, err = run(tmp_path, "check")
    assert code == 2 and out == ""
    lines = err.splitlines()
    # Grouped by the file each names (tree-wide ones first), then by message.
    assert lines[-1] == "check: 5 problems in 3 files (2 of 3 targets affected)"
    problems = [ln for ln in lines if ln.startswith("problem: ")]
    assert len(problems) == 5
    text = "\n".join(problems)
    assert "kernels/hopper/qwen/bf16/rms.cu shadows kernels/gb10/qwen/bf16/rms.cu" in text
    assert "[target hopper/qwen/bf16]" in text
    assert (
        "kernels/hopper/common/util.cuh shadows kernels/gb10/common/util.cuh with identical "
        "bytes: a pointless fork" in text
    )
    assert "util.cuh is duplicated byte for byte" in text
    assert "extra.cu is duplicated byte for byte" in text
    assert "kernels/shared/link.cu: is a symlink" in text


def test_check_reports_a_read_symlink_once(tmp_path: Path) -> None:
    tree(tmp_path)
    os.symlink("rms.cu", tmp_path / "kernels/gb10/common/alias.cu")
    code, _, err = run(tmp_path, "check")
    assert code == 2
    assert err.count("kernels/gb10/common/alias.cu: is a symlink") == 1, err


# ------------------------------------------------------------------------------ containment


def test_check_flags_a_redirect_out_of_kernels(tmp_path: Path) -> None:
    """`[model] kernel_source = "../../outside"` resolves (SPEC 1.4 does not normalise
    the referent) but its files are not the tree's: the build refuses them, so must check."""
    tree(tmp_path)
    model(tmp_path, "gb10", "stolen", kernel_source="../../outside")
    write(tmp_path, "outside/MODEL.toml", "[model]\n")
    write(tmp_path, "outside/bf16/evil.cu", "// not from the tree\n")
    code, out, err = run(tmp_path, "check")
    assert code == 2 and out == "", err
    assert err.splitlines() == [
        skipped("gb10/qwen/bf16", "gb10/stolen/bf16", "hopper/qwen/bf16"),
        "problem: kernels/gb10/../../outside/bf16/evil.cu: lies outside kernels/; kernel trees "
        "build only their own files (reached through [model] kernel_source of "
        "kernels/gb10/stolen/MODEL.toml); point that kernel_source at a model directory "
        "inside kernels/ [target gb10/stolen/bf16]",
        "check: 1 problem in 1 file (1 of 3 targets affected)",
    ]


def test_check_names_the_redirect_out_of_kernels_where_it_is_written(tmp_path: Path) -> None:
    """A redirect to a directory of the model's own name, inherited by hopper: both targets
    name gb10's MODEL.toml and its kernel_source (the file and key to change)."""
    tree(tmp_path)
    model(tmp_path, "gb10", "qwen", kernel_source="../../outside/qwen")
    write(tmp_path, "outside/qwen/MODEL.toml", "[model]\n")
    write(tmp_path, "outside/qwen/bf16/evil.cu", "// not from the tree\n")
    code, out, err = run(tmp_path, "check")
    assert code == 2 and out == "", err
    problems = [ln for ln in err.splitlines() if "evil.cu" in ln]
    assert problems == [
        "problem: kernels/gb10/../../outside/qwen/bf16/evil.cu: lies outside kernels/; kernel "
        "trees build only their own files (reached through [model] kernel_source of "
        "kernels/gb10/qwen/MODEL.toml); point that kernel_source at a model directory inside "
        "kernels/ [target gb10/qwen/bf16, hopper/qwen/bf16]"
    ]


def test_check_flags_a_use_through_a_symlinked_directory_once(tmp_path: Path) -> None:
    tree(tmp_path)
    write(tmp_path, "elsewhere/x.cu", "// reached through a link\n")
    os.symlink(tmp_path / "elsewhere", tmp_path / "kernels/linked")
    kernel_toml(tmp_path, "kernels/gb10/qwen/bf16", use=["../linked/x.cu"], shadow={"rms": "q"})
    code, _, err = run(tmp_path, "check")
    assert code == 2
    problems = [ln for ln in err.splitlines() if ln.startswith("problem: ")]
    assert problems == [
        "problem: kernels/linked: is a symlink; kernel trees hold real files only "
        "[target gb10/qwen/bf16, hopper/qwen/bf16]"
    ], err


def test_check_flags_a_symlinked_leaf_directory(tmp_path: Path) -> None:
    tree(tmp_path)
    write(tmp_path, "elsewhere/fp8/k.cu", "// a leaf from elsewhere\n")
    os.symlink(tmp_path / "elsewhere/fp8", tmp_path / "kernels/gb10/qwen/fp8")
    code, _, err = run(tmp_path, "check")
    assert code == 2
    assert (
        "problem: kernels/gb10/qwen/fp8: is a symlink; kernel trees hold real files only "
        "[target gb10/qwen/fp8, hopper/qwen/fp8]"
    ) in err.splitlines(), err


# ------------------------------------------------------------------------------ typos


def test_check_warns_about_likely_typos_and_still_passes(tmp_path: Path) -> None:
    tree(tmp_path)
    model(tmp_path, "gb10", "qwen", raw='[model]\nkernel_sauce = "llama"\n')
    hw(tmp_path, "gb10", raw='[hardware]\narch = "sm_121f"\n[buidl]\nextra_nvcc_flags = ["-DX"]\n')
    kernel_toml(
        tmp_path,
        "kernels/hopper/common",
        raw='[shadow]\nutil = "wider loads"\n[build]\nextra_nvcc_flag = ["-lineinfo"]\n'
        "[tool.other]\nkeep = 1\n",  # another tool's table: not a typo, no warning
    )
    code, out, err = run(tmp_path, "check")
    assert code == 0 and out.startswith("check: ok"), err
    assert err.splitlines() == [
        "warning: kernels/gb10/HARDWARE.toml: [buidl]: unknown table, did you mean `[build]`? "
        "(it is ignored)",
        "warning: kernels/gb10/qwen/MODEL.toml: [model] kernel_sauce: unknown key, did you mean "
        "`kernel_source`? (the key is ignored)",
        "warning: kernels/hopper/common/KERNEL.toml: [build] extra_nvcc_flag: unknown key, did "
        "you mean `extra_nvcc_flags`? (the key is ignored)",
        skipped("gb10/qwen/bf16", "hopper/qwen/bf16"),
    ]


def test_manifest_warnings_is_pure_and_knows_each_kind() -> None:

    assert manifest_warnings("k/MODEL.toml", {"model": {"kernel_source": "x"}}, "model") == []
    assert manifest_warnings(
        "k/HARDWARE.toml",
        {"hardware": {"vendr": "nvidia", "sm_cont": 3}, "defualts": {}, "kernels": {}},
        "hardware",
    ) == [
        "k/HARDWARE.toml: [hardware] vendr: unknown key, did you mean `vendor`? "
        "(the key is ignored)",
        "k/HARDWARE.toml: [hardware] sm_cont: unknown key, did you mean `sm_count`? "
        "(the key is ignored)",
        "k/HARDWARE.toml: [defualts]: unknown table, did you mean `[defaults]`? (it is ignored)",
    ]
    kernel = {"shadows": {}, "module": {}, "build": {"toolchian": "x", "extra_foo_flag": []}}
    assert manifest_warnings("K.toml", kernel, "kernel", build_keys=["extra_foo_flags"]) == [
        "K.toml: [shadows]: unknown table, did you mean `[shadow]`? (it is ignored)",
        "K.toml: [module]: unknown table, did you mean `[modules]`? (it is ignored)",
        "K.toml: [build] toolchian: unknown key, did you mean `toolchain`? (the key is ignored)",
        "K.toml: [build] extra_foo_flag: unknown key, did you mean `extra_foo_flags`? "
        "(the key is ignored)",
    ]
    # Free-form tables (stems, modules) and far-off names are never typos.
    assert manifest_warnings("K.toml", {"modules": {"ad": "x"}, "cmake": {}}, "kernel") == []


def test_read_manifest_warnings_covers_what_a_target_read(tmp_path: Path) -> None:

    tree(tmp_path)
    model(tmp_path, "hopper", "qwen", raw='[model]\nsuported_quants = ["bf16"]\n')
    kernel_toml(tmp_path, "kernels/gb10/common", raw="[shadow_exmpt]\n")
    layout = discover(tmp_path, "hopper/qwen/bf16")
    assert read_manifest_warnings(tmp_path, layout) == [
        "kernels/gb10/common/KERNEL.toml: [shadow_exmpt]: unknown table, did you mean "
        "`[shadow_exempt]`? (it is ignored)",
        "kernels/hopper/qwen/MODEL.toml: [model] suported_quants: unknown key, did you mean "
        "`supported_quants`? (the key is ignored)",
    ]
