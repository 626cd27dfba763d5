"""The committed resource baseline: ``kernels.lock`` (metrale_orch.resources.lock) and
``metrale-orch resources --lock`` / ``--check``.

The format and the comparison are checked on values; the command on a small tree built
with the real nvcc and read with the real ptxas: one hardware (sm_90a), two targets
(``h/m/a``, ``h/m/b``) each with a common ``plain`` kernel and its own ``probe``, whose
source a test rewrites (more live sums: more registers; forty sums under
``__maxnreg__(32)``: spills) and rebuilds.
"""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metrale_orch.resources import (
    KernelResources,
    LockFileError,
    ResourceLock,
    ResourceReport,
    TargetResources,
    check_lock,
    lock_from_report,
    read_lock,
    update_lock,
)
from metrale_orch.resources.lock import LockedTarget, _canonical_doc, decode_lock, encode_lock
from metrale_orch.resources.report import ModuleResources, TargetStatus
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import make_cache, make_config, write
from tests.support.resources import _cli

A, B = "h/m/a", "h/m/b"


def _k(
    name: str,
    arch: str = "sm_90a",
    *,
    regs: int = 16,
    smem: int = 0,
    stack: int = 0,
    spill: int | None = 0,
) -> KernelResources:
    return KernelResources(
        kernel=name,
        arch=arch,
        registers=regs,
        shared_bytes=smem,
        stack_bytes=stack,
        spill_store_bytes=spill,
        spill_load_bytes=spill,
    )


def _report(
    *targets: tuple[str, tuple[KernelResources, ...]], status: TargetStatus = "ok"
) -> ResourceReport:
    out = [
        TargetResources(
            target=name,
            status=status,
            arch="sm_90a",
            detail="" if status == "ok" else f"{status} detail",
            modules=tuple(
                ModuleResources(module=k.kernel, artefact=f"{name}/{k.kernel}.ptx", kernels=(k,))
                for k in kernels
            ),
        )
        for name, kernels in targets
    ]
    return ResourceReport(build_dir="build", targets=tuple(out))


# --- the file format ------------------------------------------------------------------------


def test_lock_text_is_sorted_one_line_per_kernel_and_round_trips() -> None:
    report = _report(
        (B, (_k("zeta", regs=40, smem=128), _k("alpha", stack=32, spill=8))),
        (A, (_k("probe", "sm_100a"), _k("probe"), _k("from_cubin", spill=None))),
    )
    lock = lock_from_report(report)
    text = encode_lock(lock)
    body = text[text.index("schema = 1") :]
    assert body == (
        "schema = 1\n"
        "\n"
        '["h/m/a".sm_100a]\n'
        "probe = { regs = 16, smem = 0, stack = 0, spill_stores = 0, spill_loads = 0 }\n"
        "\n"
        '["h/m/a".sm_90a]\n'
        "from_cubin = { regs = 16, smem = 0, stack = 0 }\n"
        "probe = { regs = 16, smem = 0, stack = 0, spill_stores = 0, spill_loads = 0 }\n"
        "\n"
        '["h/m/b".sm_90a]\n'
        "alpha = { regs = 16, smem = 0, stack = 32, spill_stores = 8, spill_loads = 8 }\n"
        "zeta = { regs = 40, smem = 128, stack = 0, spill_stores = 0, spill_loads = 0 }\n"
    )
    comment, _, blank = text[: text.index("schema")].rpartition("\n\n")
    assert blank == "" and all(line.startswith("# ") for line in comment.splitlines())
    assert decode_lock(text, "kernels.lock") == lock
    # The same build in another order writes the same bytes.
    shuffled = _report(
        (A, (_k("from_cubin", spill=None), _k("probe"), _k("probe", "sm_100a"))),
        (B, (_k("alpha", stack=32, spill=8), _k("zeta", regs=40, smem=128))),
    )
    assert encode_lock(lock_from_report(shuffled)) == text


def test_names_that_need_quoting_round_trip() -> None:
    odd = ("_Z5scalePf", "ns::k<float, 4>", 'quo"te\\back', "tab\there", "ünï", "x.y", "")
    lock = lock_from_report(_report((A, tuple(_k(name) for name in odd))))
    text = encode_lock(lock)
    assert "_Z5scalePf = {" in text and '"ns::k<float, 4>" = {' in text
    assert '"x.y" = {' in text  # a dot would split a bare key
    assert decode_lock(text, "kernels.lock") == lock


_LINE = "k = { regs = 1, smem = 0, stack = 0 }"


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t,
        lambda t: t.replace("\n", "\r\n"),
        lambda t: t + '["h/m/a".sm_90a]\n' + _LINE + "\n",  # a table defined twice
        lambda t: t + _LINE + "\n" + _LINE + "\n",  # a key defined twice
        lambda t: t + "k2 = { regs = 1, regs = 2, smem = 0, stack = 0 }\n",
        lambda t: t + "k3 = { regs = 01, smem = 0, stack = 0 }\n",
        lambda t: t + "k4 = { regs = 1_0, smem = 0, stack = 0 }\n",
        lambda t: t + "k5 = {regs = 1, smem = 0, stack = 0}\n",
        lambda t: t + "k6 = { }\n",
        lambda t: t + "schema = 1\n",
        lambda t: t + "  # indented comment\n \t\n",
        lambda t: t + '["schema".sm_90a]\n' + _LINE + "\n",
        lambda t: t + '["h/m/\tc".sm_90a]\n' + _LINE + "\n",
        lambda t: t + "# a comment with a \x01\n",
        lambda t: t + '["h/m/c"]\nsm_90a = 3\n',
    ],
)
def test_the_quick_reader_reads_what_tomllib_reads_or_hands_it_over(
    edit: Callable[[str], str],
) -> None:
    """decode_lock reads the lines encode_lock writes without tomllib (a large tree's lock
    is a megabyte); on any other text the quick reader gives up and tomllib decides."""
    odd = ("_Z5scalePf", "ns::k<float, 4>", 'quo"te\\back', "ünï", "x.y", "")
    quoted = encode_lock(lock_from_report(_report(('h/m/"q\\ü', tuple(map(_k, odd))))))
    assert _canonical_doc(quoted) in (None, tomllib.loads(quoted))
    report = _report(
        (A, (_k("probe", "sm_100a"), _k("probe"), _k("from_cubin", spill=None))),
        (B, (_k("alpha", stack=32, spill=8), _k("zeta", regs=40, smem=128))),
    )
    text = encode_lock(lock_from_report(report))
    assert _canonical_doc(text) == tomllib.loads(text)
    changed = edit(text)
    try:
        expected: object = tomllib.loads(changed)
    except tomllib.TOMLDecodeError:
        expected = None
    assert _canonical_doc(changed) in (None, expected)


def test_a_kernel_of_two_modules_is_locked_at_the_larger_numbers() -> None:
    report = _report((A, (_k("dup", regs=40, spill=None), _k("dup", regs=32, stack=8, spill=4))))
    (locked,) = lock_from_report(report).kernels_of(A)
    assert (locked.registers, locked.stack_bytes, locked.spill_store_bytes) == (40, 8, 4)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("schema = 1\n[x\n", r"^kernels\.lock: not valid TOML: .*line 2"),
        ('["h/m/a".sm_90a]\nk = { regs = 1, smem = 0, stack = 0 }\n', "no schema key"),
        ("schema = 2\n", r"schema 2; this metrale-orch reads schema = 1"),
        (
            'schema = 1\n["h/m/a".sm_90a]\nk = { regs = -1, smem = 0, stack = 0 }\n',
            r'^kernels\.lock: "h/m/a"\.sm_90a\.k\.regs: expected a whole number >= 0, got -1$',
        ),
        (
            'schema = 1\n["h/m/a".sm_90a]\nk = { regs = 1, smem = 0 }\n',
            r'"h/m/a"\.sm_90a\.k\.stack: expected a whole number >= 0, got nothing',
        ),
        (
            'schema = 1\n["h/m/a".sm_90a]\nk = { regs = 1, smem = 0, stack = 0, rgs = 2 }\n',
            r"\.k: unknown key 'rgs'",
        ),
        ('schema = 1\n["hopper"]\nx = 1\n', r"hopper: expected a table named by a target"),
        ('schema = 1\n["h/m/a"]\nsm_90a = 3\n', r'"h/m/a"\.sm_90a: expected a table of kernels'),
    ],
)
def test_a_malformed_lock_names_the_file_and_the_line_or_key(text: str, message: str) -> None:
    with pytest.raises(LockFileError, match=message) as caught:
        decode_lock(text, "kernels.lock")
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


def test_read_lock_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LockFileError, match=r"^kernels\.lock: does not exist; .*--lock"):
        read_lock(tmp_path / "kernels.lock", "kernels.lock")


# --- the comparison --------------------------------------------------------------------------


def test_check_finds_each_kind_of_regression() -> None:
    lock = lock_from_report(
        _report(
            (
                A,
                (
                    _k("spills", regs=32),
                    _k("spilled", regs=32, stack=16, spill=16),
                    _k("framed"),
                    _k("grows", regs=64),
                    _k("same"),
                    _k("shrinks", regs=64),
                    _k("gone"),
                    _k("cubin", spill=None),
                ),
            ),
            (B, (_k("b"),)),
        )
    )
    now = _report(
        (
            A,
            (
                _k("spills", regs=32, stack=8, spill=8),  # new spill (and new stack frame)
                _k("spilled", regs=32, stack=16, spill=24),  # more spill bytes
                _k("framed", stack=32),  # a local array: a new stack frame, no spill
                _k("grows", regs=72),
                _k("same"),
                _k("shrinks", regs=40),  # allowed: drift
                _k("fresh"),  # not in the lock
                _k("cubin", spill=None),
            ),
        ),
    )
    result = check_lock(lock, now)
    found = [(p.kernel, p.issue) for p in result.problems]
    assert found == [
        ("framed", "new-stack"),
        ("fresh", "missing"),
        ("grows", "register-growth"),
        ("spilled", "more-spill"),
        ("spills", "new-spill"),
        ("spills", "new-stack"),
    ]
    assert (result.kernels, result.targets) == (8, 1)
    assert result.drift == 2  # "shrinks" and "gone"; B is not in the report: not checked
    grows = {p.kernel: p for p in result.problems}["grows"]
    assert grows.locked and grows.now and (grows.locked.registers, grows.now.registers) == (64, 72)

    # Register growth up to the threshold passes; one more fails.
    assert "register-growth" in {p.issue for p in check_lock(lock, now, 7).problems}
    assert "register-growth" not in {p.issue for p in check_lock(lock, now, 8).problems}
    # Unknown spills (cubins) compare nothing, in either direction.
    cubin_now = _report((A, (_k("cubin", spill=None), _k("spills", regs=32, spill=None))))
    assert [p.kernel for p in check_lock(lock, cubin_now).problems] == []
    # The lock checks clean against the build it was written from.
    assert check_lock(lock, _report((B, (_k("b"),)))).problems == ()


def test_check_of_locked_targets_not_built_or_unreadable() -> None:
    lock = lock_from_report(_report((A, (_k("a1"), _k("a2")))))
    (not_built,) = check_lock(lock, _report((A, ()), status="not-built")).problems
    assert (not_built.issue, not_built.kernel) == ("not-built", "")
    assert not_built.detail == "not built, and kernels.lock holds 2 of its kernels"
    # A target never locked and not built is no problem; an unreadable one always is.
    assert check_lock(lock, _report((B, ()), status="not-built")).problems == ()
    (error,) = check_lock(lock, _report((B, ()), status="error")).problems
    assert (error.issue, error.detail) == ("error", "error detail")


def test_update_lock_replaces_only_the_targets_read() -> None:
    old = lock_from_report(_report((A, (_k("a", regs=8),)), (B, (_k("b", regs=8),))))
    new = update_lock(old, _report((A, (_k("a", regs=9), _k("a2")))))
    assert [k.registers for k in new.kernels_of(A)] == [9, 16]
    assert new.kernels_of(B) == old.kernels_of(B)
    # A target not built keeps its entries; a locked target now without kernels loses them.
    assert update_lock(old, _report((A, ()), status="not-built")) == old
    assert update_lock(old, _report((A, ()))) == ResourceLock(
        targets=(LockedTarget(target=B, kernels=old.kernels_of(B)),)
    )


# --- the command on a real build -------------------------------------------------------------


def _probe(sums: int, cap: str = "") -> str:
    """A kernel keeping ``sums`` running sums live across a loop (more: more registers)."""
    return f"""#define SUMS {sums}
extern "C" __global__ void {cap} probe(float* __restrict__ out,
                                      const float* __restrict__ in, int n) {{
    float s[SUMS];
#pragma unroll
    for (int j = 0; j < SUMS; ++j) s[j] = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {{
        const float x = in[i];
#pragma unroll
        for (int j = 0; j < SUMS; ++j) s[j] = fmaf(s[j], x, (float)(j + 1));
    }}
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < SUMS; ++j) acc += s[j] * s[(j * 7 + 3) % SUMS];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}}
"""


#: Forty live sums under a 32-register cap: ptxas spills.
SPILLING = _probe(40, "__maxnreg__(32)")


def _tree(root: Path) -> Path:
    write(root, "kernels/h/HARDWARE.toml", '[hardware]\narch = "sm_90a"\n')
    write(
        root,
        "kernels/h/common/plain.cu",
        'extern "C" __global__ void plain(float* x) { x[threadIdx.x] += 1.0f; }\n',
    )
    write(root, "kernels/h/m/MODEL.toml", "[model]\n")
    for quant in ("a", "b"):
        write(root, f"kernels/h/m/{quant}/probe.cu", _probe(8))
    return root


def _build(root: Path, *targets: str) -> None:
    config = make_config(root, root.parent / "cache")
    cache = make_cache(config)
    for name in targets:
        result = build_target(
            root, Target.parse(name), config=config, cache=cache, environ=_environ()
        )
        assert not result.failed, result.failure_text()


@pytest.fixture(scope="module")
def locked_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree built, and its kernels.lock written by the command."""
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc and ptxas are not installed")
    root = _tree(tmp_path_factory.mktemp("lock") / "tree")
    _build(root, A, B)
    code, out, err = _cli(["--root", str(root), "resources", "--lock"], _environ())
    assert (code, err) == (0, ""), out
    return root


def _environ() -> dict[str, str]:
    return dict(os.environ)


@pytest.fixture
def tree(locked_tree: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the locked tree (its build, lock and cache) to change and rebuild."""
    shutil.copytree(locked_tree.parent, tmp_path / "copy", symlinks=True)
    yield tmp_path / "copy" / "tree"


def _check(root: Path, *extra: str) -> tuple[int, str, str]:
    return _cli(["--root", str(root), "resources", "--check", *extra], _environ())


@pytest.mark.nvcc
def test_lock_written_and_an_unchanged_rebuild_checks_clean(tree: Path) -> None:
    lock = read_lock(tree / "kernels.lock", "kernels.lock")
    assert [t.target for t in lock.targets] == [A, B]
    assert [(k.kernel, k.arch) for k in lock.kernels_of(A)] == [
        ("plain", "sm_90a"),
        ("probe", "sm_90a"),
    ]
    assert all(k.registers > 0 and not k.spills for k in lock.kernels_of(A))
    text = (tree / "kernels.lock").read_text()
    assert '["h/m/a".sm_90a]\nplain = { regs = ' in text

    # Rebuilt from nothing (no build directory, no cache): the same lock checks clean.
    shutil.rmtree(tree / "build")
    shutil.rmtree(tree.parent / "cache")
    _build(tree, A, B)
    code, out, err = _check(tree)
    assert (code, err) == (0, "")
    assert out == "resources --check: 4 kernels of 2 built targets match kernels.lock\n"
    # And --lock of the same build writes the same bytes.
    assert _cli(["--root", str(tree), "resources", "--lock"], _environ())[0] == 0
    assert (tree / "kernels.lock").read_text() == text


@pytest.mark.nvcc
def test_a_kernel_changed_to_spill_fails_the_check_naming_it(tree: Path) -> None:
    write(tree, "kernels/h/m/a/probe.cu", SPILLING)
    _build(tree, A)
    code, out, err = _check(tree)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    spill = [ln for ln in lines if ": new spill: " in ln]
    assert spill == [
        f"{A} probe sm_90a: new spill: spill stores 0 B, loads 0 B → " + spill[0].split(" → ", 1)[1]
    ]
    assert spill[0].split(" → ", 1)[1].startswith("spill stores ")
    assert any(ln.startswith(f"{A} probe sm_90a: new stack frame: stack 0 B → ") for ln in lines)
    assert lines[-1].startswith("resources --check: ") and " problems against kernels.lock" in out
    assert not any(B in ln for ln in lines[:-1])  # the other target is clean

    # The same as a markdown table for a PR comment.
    code, md, _ = _check(tree, "--format", "markdown")
    assert code == 1
    assert "| target | kernel | arch | problem | kernels.lock | this build |" in md
    assert f"| {A} | `probe` | sm_90a | new spill | spill stores 0 B, loads 0 B | spill " in md
    # A check of the other target alone passes.
    assert _check(tree, "h/m/b")[0] == 0


@pytest.mark.nvcc
def test_register_growth_over_the_threshold_fails_and_under_passes(tree: Path) -> None:
    before = {k.kernel: k for k in read_lock(tree / "kernels.lock", "x").kernels_of(B)}["probe"]
    write(tree, "kernels/h/m/b/probe.cu", _probe(16))
    _build(tree, B)
    code, out, _ = _check(tree, "--json")
    (problem,) = json.loads(out)["problems"]
    grown = problem["now"]["registers"] - before.registers
    assert (problem["target"], problem["kernel"], problem["issue"]) == (
        B,
        "probe",
        "register-growth",
    )
    assert code == 1 and grown > 0
    code, out, _ = _check(tree, "--max-register-growth", str(grown - 1))
    (line, _summary) = out.splitlines()
    assert code == 1 and line == (
        f"{B} probe sm_90a: register growth: {before.registers} regs → "
        f"{before.registers + grown} regs (+{grown}, allowed +{grown - 1})"
    )
    code, out, _ = _check(tree, "--max-register-growth", str(grown))
    assert code == 0
    assert out.endswith(
        "; 1 changed within limits (`metrale-orch resources --lock` records them)\n"
    )


@pytest.mark.nvcc
def test_a_kernel_missing_from_the_lock_fails_and_a_partial_lock_adds_it(tree: Path) -> None:
    write(
        tree,
        "kernels/h/m/a/extra.cu",
        'extern "C" __global__ void extra(int* x) { x[threadIdx.x] = 7; }\n',
    )
    write(tree, "kernels/h/m/b/probe.cu", _probe(16))  # B changes too, but is not relocked
    _build(tree, A, B)
    code, out, _ = _check(tree, "h/m/a")
    (line, _summary) = out.splitlines()
    assert code == 1
    assert line.startswith(f"{A} extra sm_90a: not in kernels.lock: absent → regs ")

    before = (tree / "kernels.lock").read_text()
    code, out, err = _cli(["--root", str(tree), "resources", "--lock", "h/m/a"], _environ())
    assert (code, err) == (0, "")
    assert out == "kernels.lock: 5 kernels of 2 targets (3 from this build, 'h/m/a')\n"
    after = (tree / "kernels.lock").read_text()
    b_part = before[before.index('["h/m/b"') :]
    assert after.endswith(b_part)  # B's entries kept as they were
    assert "\nextra = { regs = " in after
    assert _check(tree, "h/m/a")[0] == 0
    assert _check(tree)[0] == 1  # B still grew past its lock


@pytest.mark.nvcc
def test_a_missing_or_malformed_lock_is_one_line_exit_2(tree: Path) -> None:
    lock = tree / "kernels.lock"
    lock.write_text(lock.read_text().replace("regs = ", "regs = -", 1))
    code, out, err = _check(tree)
    assert (code, out) == (2, "")
    assert err.startswith('error: kernels.lock: "h/m/a".sm_90a.plain.regs: expected a whole')
    assert err.count("\n") == 1
    lock.write_text("schema = 1\n[broken\n")
    code, out, err = _check(tree)
    assert (code, out) == (2, "") and err.startswith("error: kernels.lock: not valid TOML: ")
    assert "line 2" in err
    # --lock will not overwrite a file it cannot read (it keeps other targets' entries).
    assert _cli(["--root", str(tree), "resources", "--lock"], _environ())[0] == 2
    lock.unlink()
    code, out, err = _check(tree)
    assert (code, out) == (2, "")
    assert err == (
        "error: kernels.lock: does not exist; after a build, `metrale-orch resources --lock` "
        "writes it (commit it with the kernels)\n"
    )
    code, _, err = _cli(["--root", str(tree), "resources", "--format", "markdown"], _environ())
    assert code == 2 and err == "error: --format goes with --check\n"
    code, _, err = _cli(["--root", str(tree), "resources", "--lock", "--json"], _environ())
    assert code == 2 and err.startswith("error: --lock writes kernels.lock and prints no JSON")
