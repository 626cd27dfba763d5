"""The committed resource baseline: ``kernels.lock`` (metrale_orch.resources.lock) and
``metrale-orch resources --lock`` / ``--check``.

The format and the comparison are checked on values; the command on a small tree built
with the real nvcc and read with the real ptxas: one hardware (sm_90a), two targets
(``h/m/a``, ``h/m/b``) each with a common ``plain`` kernel and its own ``probe``, whose
source a test rewrites (more live sums: more registers; forty sums under
``__maxnreg__(32)``: spills) and rebuilds.

The tests of this topic that start processes are in
``tests/scenarios/resources/test_resource_lock.py``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
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
from tests.support.resources import A, B


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
