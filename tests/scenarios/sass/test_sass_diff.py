"""The SASS diff (metrale_orch.sass) and ``metrale-orch sass-diff``.

The normaliser is checked on listings captured from the real tools (CUDA 13.0's nvcc,
cuobjdump and nvdisasm 13.2); the comparison on a small tree really built with nvcc (one
module of two kernels as PTX for sm_90a, as a cubin, and as a fatbin for sm_100a), with the
real ptxas, cuobjdump and nvdisasm (the ``test`` extra installs the last two).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from metrale_orch.cli import main
from metrale_orch.sass import (
    DisassemblerMissing,
    FunctionCode,
    compare_builds,
    diff_functions,
    find_disassembler,
    parse_listing,
)
from metrale_orch.steps.target import build_target
from metrale_orch.toolchain import locate
from metrale_orch.toolchain.definitions import builtin_toolchains
from metrale_orch.tree import Target
from tests.support.build import make_config, output_kinds_tree

#: ``cuobjdump -sass`` of ``bump`` (a one-loop kernel) for sm_90a, NOP padding shortened.
CUOBJDUMP = """\

	code for sm_90a
	.target	sm_90a

		Function : bump
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;              /* 0x00000a00ff017b82 */
                                                                       /* 0x000fe20000000800 */
        /*0010*/                   S2R R7, SR_TID.X ;                  /* 0x0000000000077919 */
                                                                       /* 0x000e220000002100 */
        /*0020*/                   ULDC UR5, c[0x0][0x218] ;           /* 0x0000860000057ab9 */
                                                                       /* 0x000fe40000000800 */
        /*0030*/                   ISETP.GE.AND P0, PT, R7, UR5, PT ;  /* 0x0000000507007c0c */
                                                                       /* 0x001fda000bf06270 */
        /*0040*/               @P0 EXIT ;                              /* 0x000000000000094d */
                                                                       /* 0x000fea0003800000 */
        /*0050*/                   LDC.64 R4, c[0x0][0x210] ;          /* 0x00008400ff047b82 */
                                                                       /* 0x000e220000000a00 */
        /*0060*/                   ULDC UR4, c[0x0][0x0] ;             /* 0x0000000000047ab9 */
                                                                       /* 0x000fe20000000800 */
        /*0070*/                   ULDC.64 UR6, c[0x0][0x208] ;        /* 0x0000820000067ab9 */
                                                                       /* 0x000fca0000000a00 */
        /*0080*/                   IMAD.WIDE R2, R7, 0x4, R4 ;         /* 0x0000000407027825 */
                                                                       /* 0x003fca00078e0204 */
        /*0090*/                   LDG.E R0, desc[UR6][R2.64] ;        /* 0x0000000602007981 */
                                                                       /* 0x000ea2000c1e1900 */
        /*00a0*/                   IADD3 R7, R7, UR4, RZ ;             /* 0x0000000407077c10 */
                                                                       /* 0x000fc8000fffe0ff */
        /*00b0*/                   ISETP.GE.AND P0, PT, R7, UR5, PT ;  /* 0x0000000507007c0c */
                                                                       /* 0x000fe2000bf06270 */
        /*00c0*/                   FADD R9, R0, 1 ;                    /* 0x3f80000000097421 */
                                                                       /* 0x004fca0000000000 */
        /*00d0*/                   STG.E desc[UR6][R2.64], R9 ;        /* 0x0000000902007986 */
                                                                       /* 0x0003ee000c101906 */
        /*00e0*/              @!P0 BRA 0x80 ;                          /* 0xfffffffc00e48947 */
                                                                       /* 0x000fea000383ffff */
        /*00f0*/                   EXIT ;                              /* 0x000000000000794d */
                                                                       /* 0x000fea0003800000 */
        /*0100*/                   BRA 0x100;                          /* 0xfffffffc00fc7947 */
                                                                       /* 0x000fc0000383ffff */
        /*0110*/                   NOP;                                /* 0x0000000000007918 */
                                                                       /* 0x000fc00000000000 */
        /*0120*/                   NOP;                                /* 0x0000000000007918 */
                                                                       /* 0x000fc00000000000 */
		..........


"""

#: ``nvdisasm -c`` of the same cubin.
NVDISASM = """\
	.target	sm_90a

	.elftype	@"ET_EXEC"


//--------------------- .text.bump                --------------------------
	.section	.text.bump,"ax",@progbits
	.align	128
        .global         bump
        .type           bump,@function
        .size           bump,(.L_x_2 - bump)
        .other          bump,@"STO_CUDA_ENTRY STV_DEFAULT"
bump:
.text.bump:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R7, SR_TID.X ;
        /*0020*/                   ULDC UR5, c[0x0][0x218] ;
        /*0030*/                   ISETP.GE.AND P0, PT, R7, UR5, PT ;
        /*0040*/               @P0 EXIT ;
        /*0050*/                   LDC.64 R4, c[0x0][0x210] ;
        /*0060*/                   ULDC UR4, c[0x0][0x0] ;
        /*0070*/                   ULDC.64 UR6, c[0x0][0x208] ;
.L_x_0:
        /*0080*/                   IMAD.WIDE R2, R7, 0x4, R4 ;
        /*0090*/                   LDG.E R0, desc[UR6][R2.64] ;
        /*00a0*/                   IADD3 R7, R7, UR4, RZ ;
        /*00b0*/                   ISETP.GE.AND P0, PT, R7, UR5, PT ;
        /*00c0*/                   FADD R9, R0, 1 ;
        /*00d0*/                   STG.E desc[UR6][R2.64], R9 ;
        /*00e0*/              @!P0 BRA `(.L_x_0) ;
        /*00f0*/                   EXIT ;
.L_x_1:
        /*0100*/                   BRA `(.L_x_1);
        /*0110*/                   NOP;
        /*0120*/                   NOP;
.L_x_2:


//--------------------- SYMBOLS --------------------------

	.type		.nv.reservedSmem.offset0,@object
	.size		.nv.reservedSmem.offset0,0x4
"""

#: What both listings normalise to.
BUMP = (
    "LDC R#, c[0x0][0x28] ;",
    "S2R R#, SR_TID.X ;",
    "ULDC UR#, c[0x0][0x218] ;",
    "ISETP.GE.AND P#, PT, R#, UR#, PT ;",
    "@P# EXIT ;",
    "LDC.64 R#, c[0x0][0x210] ;",
    "ULDC UR#, c[0x0][0x0] ;",
    "ULDC.64 UR#, c[0x0][0x208] ;",
    "L0:",
    "IMAD.WIDE R#, R#, 0x4, R# ;",
    "LDG.E R#, desc[UR#][R#.64] ;",
    "IADD3 R#, R#, UR#, RZ ;",
    "ISETP.GE.AND P#, PT, R#, UR#, PT ;",
    "FADD R#, R#, 1 ;",
    "STG.E desc[UR#][R#.64], R# ;",
    "@!P# BRA L0 ;",
    "EXIT ;",
    "L1:",
    "BRA L1 ;",
)


def _cuobjdump_listing(name: str, instructions: list[str]) -> str:
    """A cuobjdump-style listing of ``instructions`` at 0x0, 0x10, …"""
    lines = ["\tcode for sm_90a", f"\t\tFunction : {name}"]
    for i, text in enumerate(instructions):
        lines.append(f"        /*{i * 16:04x}*/                   {text} ;  /* 0x0000{i:012x} */")
        lines.append("                                              /* 0x000fc00000000000 */")
    return "\n".join(lines) + "\n"


# --- the normaliser: values ----------------------------------------------------------------


def test_both_tools_normalise_to_the_same_code() -> None:
    (from_cuobjdump,) = parse_listing(CUOBJDUMP)
    assert from_cuobjdump == FunctionCode(arch="sm_90a", name="bump", lines=BUMP)
    assert parse_listing(NVDISASM) == (from_cuobjdump,)
    assert parse_listing("") == ()


def test_register_numbers_labels_and_encodings_do_not_show() -> None:
    """Another allocation, other global label numbers, other control bits: the same code."""
    renamed = (
        NVDISASM.replace("R7", "R11")
        .replace("R2", "R12")
        .replace("UR5", "UR9")
        .replace("P0", "P3")
        .replace(".L_x_1", ".L_x_18")
        .replace(".L_x_0", ".L_x_17")
    )
    assert renamed != NVDISASM and parse_listing(renamed) == parse_listing(NVDISASM)
    reencoded = CUOBJDUMP.replace("0x000fe2", "0x001fe8").replace("R9", "R3.reuse")
    assert parse_listing(reencoded) == parse_listing(CUOBJDUMP)
    # What the source decides still shows: an offset, a constant, a branch's target.
    for before, after in (("[R2.64]", "[R2.64+0x4]"), ("FADD R9, R0, 1", "FADD R9, R0, 2")):
        changed = CUOBJDUMP.replace(before, after, 1)
        assert parse_listing(changed) != parse_listing(CUOBJDUMP)
    assert parse_listing(CUOBJDUMP.replace("BRA 0x80", "BRA 0x90")) != parse_listing(CUOBJDUMP)


def test_an_inserted_instruction_shows_alone() -> None:
    """Branch targets, a call's return address and the padding move; only the line shows."""
    body = [
        "MOV R6, 0x{ret:x}",
        "CALL.REL.NOINC 0x{sub:x}",
        "@P0 BRA 0x{top:x}",
        "EXIT",
        "MOV R2, R6",
        "RET.REL.NODEC R2 0x0",
        "BRA 0x{self:x}",
        "NOP",
    ]

    def listing(extra: list[str]) -> str:
        n = len(extra)
        at = {"ret": (n + 2) * 16, "sub": (n + 4) * 16, "top": 0, "self": (n + 6) * 16}
        return _cuobjdump_listing("k", [*extra, *(b.format(**at) for b in body)])

    (old,) = parse_listing(listing(["FADD R1, R1, 1"]))
    (new,) = parse_listing(listing(["FADD R1, R1, 1", "FMUL R4, R1, 3", "NOP"]))
    assert old.lines[:4] == ("L0:", "FADD R#, R#, 1 ;", "MOV R#, L1 ;", "CALL.REL.NOINC L2 ;")
    assert old.lines[-3:] == ("RET.REL.NODEC R# L0 ;", "L3:", "BRA L3 ;")  # padding gone
    (change,) = diff_functions("h/m/q", "ops", [old], [new], base_label="a", new_label="b")
    assert (change.kind, change.added, change.removed) == ("changed", 2, 0)
    assert [ln for ln in change.diff[2:] if ln[0] in "+-"] == ["+FMUL R#, R#, 3 ;", "+NOP ;"]
    assert change.diff[:2] == ("--- a k (sm_90a)", "+++ b k (sm_90a)")


#: The shape of nvdisasm's listing of a kernel with a local subroutine (a call, its return
#: address loaded by hand, a return to the function's own symbol).
NVDISASM_CALL = """\
\t.target\tsm_90a
\t.section\t.text.k,"ax",@progbits
k:
.text.k:
.L_x_0:
        /*0000*/                   FADD R1, R1, 1 ;
        /*0010*/                   MOV R6, 0x30 ;
        /*0020*/                   CALL.REL.NOINC `($__internal_0_$sub) ;
        /*0030*/               @P0 BRA `(.L_x_0) ;
        /*0040*/                   EXIT ;
$__internal_0_$sub:
        /*0050*/                   MOV R2, R6 ;
        /*0060*/                   RET.REL.NODEC R2 `(k) ;
.L_x_1:
        /*0070*/                   BRA `(.L_x_1);
        /*0080*/                   NOP;
.L_x_2:
"""


def test_nvdisasm_symbols_read_as_cuobjdump_addresses() -> None:
    cuobjdump = _cuobjdump_listing(
        "k",
        [
            "FADD R1, R1, 1",
            "MOV R6, 0x30",
            "CALL.REL.NOINC 0x50",
            "@P0 BRA 0x0",
            "EXIT",
            "MOV R2, R6",
            "RET.REL.NODEC R2 0x0",
            "BRA 0x70",
            "NOP",
        ],
    )
    assert parse_listing(NVDISASM_CALL) == parse_listing(cuobjdump)


def test_diff_functions_names_added_and_removed_kernels() -> None:
    def code(name: str, *lines: str) -> FunctionCode:
        return FunctionCode(arch="sm_90a", name=name, lines=lines)

    base = [code("same", "EXIT ;"), code("gone", "NOP ;", "EXIT ;")]
    new = [code("same", "EXIT ;"), code("fresh", "EXIT ;")]
    got = diff_functions("t", "m", base, new, base_label="a", new_label="b")
    assert [(c.kernel, c.kind, c.added, c.removed) for c in got] == [
        ("fresh", "added", 1, 0),
        ("gone", "removed", 0, 2),
    ]
    assert diff_functions("t", "m", base, base, base_label="a", new_label="b") == ()


# --- finding the disassembler ------------------------------------------------------------


def _tool(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_disassembler_is_found_as_nvcc_is(tmp_path: Path) -> None:
    nvcc = builtin_toolchains()["nvcc"]
    empty, home, site = tmp_path / "path", tmp_path / "cuda", tmp_path / "site"
    empty.mkdir()
    _tool(home / "bin" / "nvcc")
    environ = {"PATH": str(empty), "CUDA_HOME": str(home)}
    with pytest.raises(DisassemblerMissing) as caught:
        find_disassembler(nvcc, environ, site_dirs=[site])
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 2
    assert "PATH, $CUDA_HOME/bin, $CUDA_PATH/bin" in message
    assert "`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`" in message
    # The venv's wheel, then $CUDA_HOME/bin, then PATH: each found, cuobjdump first.
    wheel = _tool(site / "nvidia" / "cu13" / "bin" / "nvdisasm")
    found = find_disassembler(nvcc, environ, site_dirs=[site])
    assert (found.kind, found.path) == ("nvdisasm", wheel)
    in_home = _tool(home / "bin" / "nvdisasm")
    assert find_disassembler(nvcc, environ, site_dirs=[site]).path == in_home
    on_path = _tool(empty / "cuobjdump")
    found = find_disassembler(nvcc, environ, site_dirs=[site])
    assert (found.kind, found.path) == ("cuobjdump", on_path)


# --- the real thing: a small tree built with nvcc --------------------------------------------

#: ``scale`` and ``sum`` in one module; the tree builds it as PTX, a cubin and a fatbin.
OPS = """\
extern "C" __global__ void scale(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
extern "C" __global__ void sum(const float* x, float* out, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  *out = s;
}
"""
TARGETS = ("h/m/q", "hc/m/q", "hf/m/q")


def _tree(root: Path) -> Path:
    """The output-kinds tree (PTX, cubin, fatbin) with ``ops.cu`` as each leaf's source."""
    return output_kinds_tree(root, {"ops.cu": OPS})


def _build(root: Path, build_dir: Path, environ: Mapping[str, str]) -> Path:
    config = make_config(root, root / "cache", cache_mode="off", build_dir=str(build_dir))
    for name in TARGETS:
        result = build_target(root, Target.parse(name), config=config, cache=None, environ=environ)
        assert not result.failed, result.failure_text()
    return build_dir


def _cli(root: Path, argv: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *argv], environ=environ, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tree, built into its ``build/``."""
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc and ptxas are not installed")
    root = _tree(tmp_path_factory.mktemp("sass") / "tree")
    _build(root, root / "build", dict(os.environ))
    yield root


@pytest.mark.nvcc
def test_an_unchanged_rebuild_shows_nothing(built: Path, tmp_path: Path) -> None:
    environ = dict(os.environ)
    again = _build(built, tmp_path / "again", environ)
    got = compare_builds(built, again, built / "build", None, environ)
    assert (got.changes, got.notes, got.modules, got.disassembled) == ((), (), 3, 0)
    code, out, err = _cli(built, ["sass-diff", str(again)], environ)
    assert (code, err) == (0, "")
    assert (
        out
        == f"sass-diff {again.as_posix()} → build: no kernel changed (3 modules, 0 disassembled)\n"
    )
    # Other bytes, the same machine code (-lineinfo adds line tables): every module is
    # disassembled on both sides, and still nothing shows.
    lineinfo = _build(
        built, tmp_path / "lineinfo", {**environ, "METRALE_EXTRA_NVCC_FLAGS": "-lineinfo"}
    )
    assert (lineinfo / "h/m/q/ops.ptx").read_bytes() != (built / "build/h/m/q/ops.ptx").read_bytes()
    got = compare_builds(built, lineinfo, built / "build", "h*/m/q", environ)
    assert (got.changes, got.disassembled) == ((), 3)


@pytest.fixture(scope="module")
def changed(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tree whose ``scale`` multiplies once more, built."""
    root = tmp_path_factory.mktemp("changed") / "tree"
    shutil.copytree(built / "kernels", root / "kernels")
    shutil.copytree(built / "toolchains", root / "toolchains")
    for hw in ("h", "hc", "hf"):
        ops = root / f"kernels/{hw}/m/q/ops.cu"
        ops.write_text(OPS.replace("x[i] * 2.0f + 1.0f", "(x[i] * 2.0f + 1.0f) * x[i]"))
    _build(root, root / "build", dict(os.environ))
    return root


@pytest.mark.nvcc
def test_a_changed_kernel_is_named_with_its_diff(built: Path, changed: Path) -> None:
    environ = dict(os.environ)
    base = built / "build"
    got = compare_builds(changed, base, changed / "build", None, environ)
    assert [(c.target, c.module, c.kernel, c.arch, c.kind) for c in got.changes] == [
        ("h/m/q", "ops", "scale", "sm_90a", "changed"),
        ("hc/m/q", "ops", "scale", "sm_90a", "changed"),
        ("hf/m/q", "ops", "scale", "sm_100a", "changed"),
    ]  # sum, in the same module, is not listed
    assert (got.modules, got.disassembled, got.notes) == (3, 3, ())
    for change in got.changes:
        assert [ln for ln in change.diff[2:] if ln[0] in "+-"] == ["+FMUL R#, R#, R# ;"]
    code, out, err = _cli(changed, ["sass-diff", str(base), "hc/*"], environ)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    counts = [ln for ln in lines if ln.startswith("hc/m/q: ")]
    assert counts == ["hc/m/q: ops: scale (sm_90a): 1 line changed (+1 -0)"]
    assert lines[1:3] == [
        f"--- {base.as_posix()}/hc/m/q/ops.cubin scale (sm_90a)",
        "+++ build/hc/m/q/ops.cubin scale (sm_90a)",
    ]
    assert lines[-1] == (
        f"sass-diff {base.as_posix()} → build: 1 kernel changed (1 module, 1 disassembled)"
    )


@pytest.mark.nvcc
def test_json_and_an_unreadable_target(built: Path, changed: Path, tmp_path: Path) -> None:
    environ = dict(os.environ)
    base = built / "build"
    code, out, err = _cli(changed, ["sass-diff", str(base), "h/*", "--json"], environ)
    assert (code, err) == (1, "")
    doc = json.loads(out)
    assert out == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    (change,) = doc["changes"]
    assert (change["target"], change["kernel"], change["added"], change["removed"]) == (
        "h/m/q",
        "scale",
        1,
        0,
    )
    assert (doc["modules"], doc["disassembled"], doc["notes"]) == (1, 1, [])

    broken = tmp_path / "broken"
    shutil.copytree(base, broken)
    (broken / "hc/m/q/manifest.json").write_text("{not json")
    code, out, err = _cli(built, ["sass-diff", str(broken)], environ)
    assert (code, err) == (1, "")
    (bad,) = [ln for ln in out.splitlines() if ln.startswith("hc/m/q: ")]
    assert f"{broken.as_posix()}/hc/m/q/manifest.json: cannot be read" in bad
    assert out.splitlines()[-1].endswith(
        "no kernel changed (2 modules, 0 disassembled; 1 target not compared)"
    )


@pytest.mark.nvcc
def test_nvdisasm_alone_gives_the_same_diff(built: Path, changed: Path, tmp_path: Path) -> None:
    """Without cuobjdump: nvdisasm reads the cubins (the fatbin's taken out of it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("nvcc", "ptxas"):
        real = shutil.which(name)
        assert real is not None
        (bin_dir / name).symlink_to(real)
    tool = find_disassembler(builtin_toolchains()["nvcc"], dict(os.environ))
    nvdisasm = tool.path.with_name("nvdisasm")
    assert nvdisasm.is_file(), "the test extra installs nvidia-cuda-nvdisasm beside cuobjdump"
    (bin_dir / "nvdisasm").symlink_to(nvdisasm)
    only = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/")}
    base = built / "build"
    want = compare_builds(changed, base, changed / "build", None, dict(os.environ))
    got = compare_builds(changed, base, changed / "build", None, only, site_dirs=[])
    assert got == want


@pytest.mark.nvcc
def test_a_missing_disassembler_is_one_line_exit_2(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("nvcc", "ptxas"):
        real = shutil.which(name)
        assert real is not None
        (bin_dir / name).symlink_to(real)
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    environ = {"PATH": str(bin_dir), "CUDA_HOME": str(cuda)}
    monkeypatch.setattr(locate, "_site_dirs", lambda: [tmp_path / "no-wheels"])
    code, out, err = _cli(built, ["sass-diff", str(built / "build")], environ)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("error: sass-diff needs cuobjdump or nvdisasm")
    assert "`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`" in err

    code, out, err = _cli(built, ["sass-diff", str(tmp_path / "nowhere")], dict(os.environ))
    assert (code, out) == (2, "")
    assert err.startswith("error: sass-diff ") and "not a directory" in err
