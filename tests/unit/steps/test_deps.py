"""What a compile read: dependency-list parsing, classification, recording, verification;
the include scanner's fast first guess; keys of flag-read files and path-embedding flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metrale_orch.paths import stage_relpath
from metrale_orch.steps.deps import (
    FileHasher,
    classify,
    flag_files,
    inputs_match,
    parse_depfile,
    record_inputs,
)
from metrale_orch.steps.includes import include_dirs, parse_includes, pre_includes
from metrale_orch.steps.keys import embeds_paths


def test_parse_depfile_nvcc_and_gcc_forms() -> None:
    nvcc = "a.ptx : a.cu \\\n    /usr/include/x.h \\\n    ./p.cuh\n"
    assert parse_depfile(nvcc) == ["a.cu", "/usr/include/x.h", "./p.cuh"]
    gcc = "a.o: a.cu /usr/include/x.h \\\n b\\ c.cuh q$$.h\n"
    assert parse_depfile(gcc) == ["a.cu", "/usr/include/x.h", "b c.cuh", "q$.h"]


def test_parse_depfile_phony_rules_and_duplicates() -> None:
    text = "a.o: a.cu p.cuh p.cuh\np.cuh:\n"
    assert parse_depfile(text) == ["a.cu", "p.cuh"]
    assert parse_depfile("") == []


def test_flag_files_every_form() -> None:
    flags = [
        "-include",
        "pre.cuh",
        "--pre-include=pre2.cuh",
        "-imacros",
        "m.h",
        "--options-file=o1.txt,o2.txt",
        "-optf",
        "o3.txt",
        "-DX=1",
    ]
    assert list(flag_files(flags)) == ["pre.cuh", "pre2.cuh", "m.h", "o1.txt", "o2.txt", "o3.txt"]
    assert pre_includes(flags) == ("pre.cuh", "pre2.cuh", "m.h", "o1.txt", "o2.txt", "o3.txt")


def test_include_dirs_takes_isystem_forms() -> None:
    flags = ["-isystem=sys", "-isystem", "sys2", "-Iinc", "-I/abs", "-iquote", "q"]
    # The compiler's order: -iquote, the flags' -I, the role dir (-I.), -isystem.
    assert include_dirs("m/q", flags) == ("m/q/q", "m/q/inc", "m/q", "m/q/sys", "m/q/sys2")
    # Flags placed after -I. on the command line ($METRALE_EXTRA_NVCC_FLAGS ...) come after.
    assert include_dirs("m/q", ["-Ia"], ["-Ib"]) == ("m/q/a", "m/q", "m/q/b")


@pytest.mark.parametrize(
    "text",
    [
        b'#include "p.cuh"\n',
        b'  #  include "p.cuh"\n',
        b'%:include "p.cuh"\n',
        b'/* c */ #include "p.cuh"\n',
        b'#inc\\\nlude "p.cuh"\n',
        b'#\x0cinclude "p.cuh"\n',
        b'#include_next "p.cuh"\n',
        b'#if __has_include("p.cuh")\n#endif\n',
    ],
    ids=["plain", "blanks", "digraph", "comment", "splice", "formfeed", "next", "has_include"],
)
def test_scanner_sees_include_forms(text: bytes) -> None:
    assert "p.cuh" in parse_includes(text).quoted


def test_scanner_computed_include() -> None:
    assert parse_includes(b'#define HDR "p.cuh"\n#include HDR\n').computed


def test_classify_stage_toolkit_abs(tmp_path: Path) -> None:
    stage = str(tmp_path / "stage")
    cwd = stage + "/m/q"
    roots = ["/opt/cuda", "/opt/cuda/targets/x/include"]
    assert classify("../../common/u.cuh", stage_dir=stage, cwd=cwd, roots=roots) == (
        "stage",
        "../../common/u.cuh",
    )
    assert classify("./p.cuh", stage_dir=stage, cwd=cwd, roots=roots) == ("stage", "p.cuh")
    assert classify("/opt/cuda/bin/../include/c.h", stage_dir=stage, cwd=cwd, roots=roots) == (
        "toolkit0",
        "include/c.h",
    )
    assert classify("/usr/include/s.h", stage_dir=stage, cwd=cwd, roots=roots) == (
        "abs",
        "/usr/include/s.h",
    )
    # Escaping the stage by `..` is outside, by absolute path.
    outside = classify("../../../../x.cuh", stage_dir=stage, cwd=cwd, roots=roots)
    assert outside == ("abs", os.path.normpath(os.path.join(cwd, "../../../../x.cuh")))


def test_record_and_verify_every_kind(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    (stage / "m/q").mkdir(parents=True)
    toolkit = tmp_path / "toolkit"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include/t.h").write_text("t1")
    outside = tmp_path / "abs.h"
    outside.write_text("a1")
    staged = {"m/q/k.cu": "h-k", "common/u.cuh": "h-u"}
    hasher = FileHasher()
    recorded = record_inputs(
        ["k.cu", "../../common/u.cuh", str(toolkit / "include/t.h"), str(outside)],
        stage_dir=str(stage),
        cwd=str(stage / "m/q"),
        module_cwd="m/q",
        staged=staged,
        roots=[str(toolkit)],
        hasher=hasher,
    )
    kinds = [r[0] for r in recorded]
    assert kinds == ["abs", "stage", "stage", "toolkit0"]
    assert all(r[2] for r in recorded)

    def ok(staged_now: dict[str, str], roots: list[str]) -> bool:
        return inputs_match(
            recorded, module_cwd="m/q", staged=staged_now, roots=roots, hasher=FileHasher()
        )

    assert ok(staged, [str(toolkit)])
    # A staged file with other content, an edited outside file, an edited toolkit
    # header, or a toolkit elsewhere with other content: each one is a miss.
    assert not ok({**staged, "common/u.cuh": "h-u2"}, [str(toolkit)])
    outside.write_text("a2")
    assert not ok(staged, [str(toolkit)])
    outside.write_text("a1")
    assert ok(staged, [str(toolkit)])
    (toolkit / "include/t.h").write_text("t2")
    assert not ok(staged, [str(toolkit)])
    # The same toolkit content in another directory still matches (relative spelling).
    other = tmp_path / "other"
    (other / "include").mkdir(parents=True)
    (other / "include/t.h").write_text("t1")
    assert ok(staged, [str(other)])


def test_verify_rejects_malformed_or_empty_records() -> None:
    for bad in (None, [], [["stage", "x"]], [["stage", "x", ""]], "x", [["toolkit9", "a", "h"]]):
        assert not inputs_match(bad, module_cwd=".", staged={}, roots=[], hasher=FileHasher())


def test_toolkit_record_cannot_escape_its_root(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s")
    digest = FileHasher().digest(str(tmp_path / "secret"))
    rec = [["toolkit0", "../secret", digest]]
    root = str(tmp_path / "tk")
    assert not inputs_match(rec, module_cwd=".", staged={}, roots=[root], hasher=FileHasher())


def test_file_hasher_sees_a_same_size_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "h.h"
    path.write_text("v1")
    hasher = FileHasher()
    first = hasher.digest(str(path))
    st = path.stat()
    path.write_text("v2")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: ctime moves
    assert hasher.digest(str(path)) != first
    assert hasher.digest(str(tmp_path / "missing")) == ""
    assert hasher.digest(str(tmp_path)) == ""


@pytest.mark.parametrize(
    ("flags", "embeds"),
    [
        (["-lineinfo"], True),
        (["-G"], True),
        (["-g"], True),
        (["--generate-line-info"], True),
        (["-DX=1", "-O3"], False),
    ],
)
def test_embeds_paths(flags: list[str], embeds: bool) -> None:
    assert embeds_paths(flags) is embeds


@pytest.mark.parametrize(
    ("path", "start"),
    [
        ("common/add.cu", "common"),
        ("common/add.cu", "models/x"),
        ("a/b/c.h", "a/b/d/e"),
        ("a.h", "."),
        (".", "."),
        ("a/b/.metrale-out/m/m.ptx", "a/b"),
        ("a/b", "a/b"),
        ("a/bc/x.h", "a/b"),
        ("a/b/x.h", "a/./b"),
        ("./a/./b.h", "a"),
        ("a//b.h", "a"),
        ("../up.h", "common"),
        ("common/x.h", "../elsewhere"),
        ("a..b/x.h", "a..b"),
        ("/abs/inc.h", "common"),
    ],
)
def test_key_paths_are_relpath(
    path: str, start: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The remembered form must name every closure file exactly as relpath does (it is
    # hashed into every key), again when asked from another working directory.
    import posixpath

    for cwd in (tmp_path, tmp_path / "deep" / "er"):
        cwd.mkdir(parents=True, exist_ok=True)
        monkeypatch.chdir(cwd)
        assert stage_relpath(path, start) == posixpath.relpath(path, start)
