"""The wrong-hit mutation suite: a cache hit is byte-for-byte what a clean compile produces.

For every kind of input a compile reads (each include form, each file-reading
flag, each keyed environment variable, the compiler's identity behind a wrapper,
flags, renames, defaults, toolchain files, files outside the tree) one case
builds a tiny project (one target ``hw/m/q``, one module) with the cache on,
mutates ONE thing that changes what a clean compile produces, then

- (a) rebuilds in the same checkout, cache on;
- (b) builds a fresh copy of the mutated project in another directory (empty
  build dir, same local cache);
- (c) builds another copy with ``METRALE_ORCH_CACHE_MODE=off`` (the clean truth),

and requires every file of the target's output directory from (a) and (b) to
equal (c)'s byte for byte (``manifest.json`` without its ``outcome`` fields).
It first checks that the mutation really changes the clean artefacts, otherwise
the case proves nothing. For inputs outside ``kernels/`` (an absolute include,
an include escaping the tree, ``-I/abs``, a header found through ``CPATH``) a
refusal is also fine: a non-zero exit and an error line naming the file, no
traceback. Exit 0 with bytes different from (c) is a **wrong hit**; the last
test prints ``wrong hits: N of M mutations`` and fails when N > 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.trust import (
    HAS_NVCC,
    REAL_GCC,
    REAL_NVCC,
    Run,
    artefacts,
    base_env,
    copy_project,
    diff_outputs,
    doit_run,
    doit_runs,
    outputs,
    with_path,
    write_files,
)

pytestmark = pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH")

# ------------------------------------------------------------------------------ the cases

C = "kernels/hw/common/"
L = "kernels/hw/m/q/"
HW = "kernels/hw/HARDWARE.toml"
P1 = "#pragma once\n#define X 1\n"
P2 = "#pragma once\n#define X 2\n"
P3 = "#pragma once\n#define X 3\n"
GUARD = "#ifndef X\n#define X 1\n#endif\n"
BODY = 'extern "C" __global__ void k(int* o) { o[0] = X; }\n'


def hardware(*flags: str, defaults: str = "") -> str:
    text = '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n'
    if flags:
        text += "\n[build]\nextra_nvcc_flags = [" + ", ".join(f'"{f}"' for f in flags) + "]\n"
    if defaults:
        text += "\n[defaults]\n" + defaults
    return text


def kernel(head: str = "") -> str:
    return head + ("\n" if head and not head.endswith("\n") else "") + BODY


TOOLCHAIN = """[toolchain]
name = "nvcc"
extends = "nvcc"
vendors = ["nvidia", "cuda"]
output = "{output}"
"""


def wrapper(real: str, *extra: str) -> str:
    args = "".join(f"{a} " for a in extra)
    return f'#!/bin/sh\nexec {real} {args}"$@"\n'


@dataclass(frozen=True)
class Mutation:
    """One case. Texts and values may use @EXT@ (a directory outside the project),
    @EXTREL@ (the same without its leading /), @NVCC@ and @GCC@ (the real compilers)."""

    id: str
    #: the project before (under kernels/ or toolchains/; the layout's empty leaf is added)
    files: Mapping[str, str]
    #: project files after the mutation (None deletes)
    edits: Mapping[str, str | None] = field(default_factory=dict)
    #: files under the case's outside directory: ext/... (headers), bin/... (wrappers on PATH)
    outside_before: Mapping[str, str] = field(default_factory=dict)
    outside_after: Mapping[str, str | None] = field(default_factory=dict)
    env_before: Mapping[str, str] = field(default_factory=dict)
    env_after: Mapping[str, str] = field(default_factory=dict)
    #: the input lies outside kernels/: a refusal naming one of `names` is fine too
    outside: bool = False
    names: tuple[str, ...] = ()
    #: why this mutation may change no artefact with this compiler (then the case is skipped)
    inert_reason: str = ""


def _base(files: Mapping[str, str]) -> dict[str, str]:
    return {
        HW: hardware(),
        "kernels/hw/m/MODEL.toml": "[model]\n",
        L + ".gitkeep": "",
        **files,
    }


def _include_case(id_: str, head: str, *, where: str = C) -> Mutation:
    return Mutation(
        id_,
        _base({where + "k.cu": kernel(head), where + "p.cuh": P1}),
        edits={where + "p.cuh": P2},
    )


def _env_dir_case(var: str, inert_reason: str = "") -> Mutation:
    head = "#include <p.cuh>"
    if inert_reason:  # the compiler may ignore the variable: keep the tree building without it
        head = "#if __has_include(<p.cuh>)\n#include <p.cuh>\n#endif\n" + GUARD
    return Mutation(
        var,
        _base({C + "k.cu": kernel(head)}),
        outside_before={"ext/d1/p.cuh": P1, "ext/d2/p.cuh": P2},
        env_before={var: "@EXT@/d1"},
        env_after={var: "@EXT@/d2"},
        outside=True,
        names=("p.cuh", var),
        inert_reason=inert_reason,
    )


def _env_flags_case(var: str) -> Mutation:
    return Mutation(
        var,
        _base({C + "k.cu": kernel(GUARD)}),
        env_after={var: "-DX=2"},
    )


CASES: tuple[Mutation, ...] = (
    # ---- include forms
    _include_case("quoted-leaf", '#include "p.cuh"', where=L),
    _include_case("quoted-common", '#include "p.cuh"'),
    Mutation(
        "angled-via-I",
        _base({HW: hardware("-Iinc"), C + "k.cu": kernel("#include <p.cuh>"), C + "inc/p.cuh": P1}),
        edits={C + "inc/p.cuh": P2},
    ),
    _include_case("digraph", '%:include "p.cuh"'),
    _include_case("comment-before-hash", '/* c */ #include "p.cuh"'),
    _include_case("line-splice", '#inc\\\nlude "p.cuh"'),
    _include_case("form-feed-after-hash", '#\finclude "p.cuh"'),
    Mutation(
        "has-include-guarded",
        _base(
            {
                C + "k.cu": kernel(
                    '#if __has_include("p.cuh")\n#include "p.cuh"\n#endif\n' + GUARD
                ),
                C + "p.cuh": P3,
            }
        ),
        edits={C + "p.cuh": P2},
    ),
    Mutation(
        "has-include-appears",
        _base(
            {C + "k.cu": kernel('#if __has_include("p.cuh")\n#include "p.cuh"\n#endif\n' + GUARD)}
        ),
        edits={C + "p.cuh": P2},
    ),
    _include_case("computed-include", '#define HDR "p.cuh"\n#include HDR'),
    # ---- flags that make the compiler read a file
    Mutation(
        "flag-include",
        _base({HW: hardware("-include", "p.cuh"), C + "k.cu": kernel(), C + "p.cuh": P1}),
        edits={C + "p.cuh": P2},
    ),
    Mutation(  # nvcc has no -imacros of its own: this is how a user hands it to gcc's pass
        "flag-imacros",
        _base({HW: hardware("-Xcompiler=-imacros,p.cuh"), C + "k.cu": kernel(), C + "p.cuh": P1}),
        edits={C + "p.cuh": P2},
    ),
    Mutation(
        "flag-options-file",
        _base(
            {
                HW: hardware("--options-file=cfg/opts.txt"),
                C + "k.cu": kernel(),
                C + "cfg/opts.txt": "-DX=1\n",
            }
        ),
        edits={C + "cfg/opts.txt": "-DX=2\n"},
    ),
    Mutation(
        "flag-isystem-eq",
        _base(
            {
                HW: hardware("-isystem=inc"),
                C + "k.cu": kernel("#include <p.cuh>"),
                C + "inc/p.cuh": P1,
            }
        ),
        edits={C + "inc/p.cuh": P2},
    ),
    Mutation(
        "flag-I-abs-outside",
        _base({HW: hardware("-I@EXT@/inc"), C + "k.cu": kernel("#include <p.cuh>")}),
        outside_before={"ext/inc/p.cuh": P1},
        outside_after={"ext/inc/p.cuh": P2},
        outside=True,
        names=("p.cuh", "@EXT@/inc", "HARDWARE.toml"),
    ),
    # ---- the search order and flags found outside the TOML flag list (an adversarial
    # review's reproductions: each gave a wrong hit before the scan followed them)
    Mutation(
        "new-header-earlier-on-I",
        _base(
            {
                HW: hardware("-Iinc"),
                C + "k.cu": kernel("#include <p.cuh>"),
                C + "p.cuh": P1,
                C + "inc/.keep": "",
            }
        ),
        edits={C + "inc/p.cuh": P2},
    ),
    Mutation(
        "I-in-options-file",
        _base(
            {
                HW: hardware("--options-file=cfg/opts"),
                C + "cfg/opts": "-Iinc1 -Iinc2\n",
                C + "k.cu": kernel("#include <p.cuh>"),
                C + "inc2/p.cuh": P1,
                C + "inc1/.keep": "",
            }
        ),
        edits={C + "inc1/p.cuh": P2},
    ),
    Mutation(
        "I-in-METRALE_EXTRA_NVCC_FLAGS",
        _base(
            {
                C + "k.cu": kernel("#include <p.cuh>"),
                C + "inc2/p.cuh": P1,
                C + "inc1/.keep": "",
            }
        ),
        edits={C + "inc1/p.cuh": P2},
        env_before={"METRALE_EXTRA_NVCC_FLAGS": "-Iinc1 -Iinc2"},
        env_after={"METRALE_EXTRA_NVCC_FLAGS": "-Iinc1 -Iinc2"},
    ),
    Mutation(
        "nested-options-file",
        _base(
            {
                HW: hardware("--options-file=cfg/a.txt"),
                C + "cfg/a.txt": "--options-file=cfg/b.txt\n",
                C + "cfg/b.txt": "-DX=1\n",
                C + "k.cu": kernel(),
            }
        ),
        edits={C + "cfg/b.txt": "-DX=2\n"},
    ),
    Mutation(
        "gcc-response-file",
        _base(
            {
                HW: hardware("-Xcompiler=@cfg/gccopts"),
                C + "cfg/gccopts": "-DX=1\n",
                C + "k.cu": kernel(),
            }
        ),
        edits={C + "cfg/gccopts": "-DX=2\n"},
    ),
    Mutation(
        "ccbin-wrapper-adds-define",
        _base({HW: hardware("-ccbin=@EXT@/cc/bin/gcc"), C + "k.cu": kernel(GUARD)}),
        outside_before={"ext/cc/bin/gcc": wrapper("@GCC@")},
        outside_after={"ext/cc/bin/gcc": wrapper("@GCC@", "-DX=2")},
    ),
    # ---- environment the compilers read
    _env_dir_case("CPATH"),
    Mutation(
        "CPATH-header-edited",
        _base({C + "k.cu": kernel("#include <p.cuh>")}),
        outside_before={"ext/d1/p.cuh": P1},
        outside_after={"ext/d1/p.cuh": P2},
        env_before={"CPATH": "@EXT@/d1"},
        env_after={"CPATH": "@EXT@/d1"},
        outside=True,
        names=("p.cuh", "CPATH"),
    ),
    _env_dir_case(
        "C_INCLUDE_PATH",
        "nvcc preprocesses a .cu as C++, so gcc reads CPLUS_INCLUDE_PATH, not C_INCLUDE_PATH",
    ),
    _env_dir_case("CPLUS_INCLUDE_PATH"),
    _env_flags_case("NVCC_PREPEND_FLAGS"),
    _env_flags_case("NVCC_APPEND_FLAGS"),
    # ---- the compiler's identity behind a wrapper (same --version)
    Mutation(
        "nvcc-wrapper-adds-define",
        _base({C + "k.cu": kernel(GUARD)}),
        outside_before={"bin/nvcc": wrapper("@NVCC@")},
        outside_after={"bin/nvcc": wrapper("@NVCC@", "-DX=2")},
    ),
    Mutation(
        "gcc-wrapper-adds-define",
        _base({C + "k.cu": kernel(GUARD)}),
        outside_before={"bin/gcc": wrapper("@GCC@")},
        outside_after={"bin/gcc": wrapper("@GCC@", "-DX=2")},
    ),
    # ---- the tree's own settings
    Mutation(
        "extra-nvcc-flags",
        _base({HW: hardware("-DX=1"), C + "k.cu": kernel()}),
        edits={HW: hardware("-DX=2")},
    ),
    Mutation(
        "modules-rename",
        _base({C + "k.cu": kernel(GUARD), C + "KERNEL.toml": '[modules]\nk = "alpha"\n'}),
        edits={C + "KERNEL.toml": '[modules]\nk = "beta"\n'},
    ),
    Mutation(
        "defaults-lever",
        _base({HW: hardware(defaults="lm_head_batchm_max = 8\n"), C + "k.cu": kernel(GUARD)}),
        edits={HW: hardware(defaults="lm_head_batchm_max = 12\n")},
    ),
    Mutation(
        "toolchain-file",
        {
            **_base({C + "k.cu": kernel(GUARD)}),
            "toolchains/nvcc.toml": TOOLCHAIN.format(output="ptx"),
        },
        edits={"toolchains/nvcc.toml": TOOLCHAIN.format(output="cubin")},
    ),
    Mutation(
        "source-rename",
        _base({C + "k.cu": kernel(GUARD)}),
        edits={C + "k.cu": None, C + "j.cu": kernel(GUARD)},
    ),
    # ---- includes that leave the tree
    Mutation(
        "absolute-include",
        _base({C + "k.cu": kernel('#include "@EXT@/x.cuh"')}),
        outside_before={"ext/x.cuh": P1},
        outside_after={"ext/x.cuh": P2},
        outside=True,
        names=("x.cuh", "k.cu"),
    ),
    Mutation(  # 40 "../" reach / from any stage depth: the same file from the tree and stage
        "deep-dotdot-include",
        _base({C + "k.cu": kernel('#include "' + "../" * 40 + '@EXTREL@/x.cuh"')}),
        outside_before={"ext/x.cuh": P1},
        outside_after={"ext/x.cuh": P2},
        outside=True,
        names=("x.cuh", "k.cu"),
    ),
)

# ------------------------------------------------------------------------------ the harness

#: case id -> "held" | "refused" | "wrong" | "inert" (filled as the cases run)
RESULTS: dict[str, str] = {}


@dataclass
class Case:
    """Where one case lives: ``base`` holds A/, B/, C/, ext/ and bin/."""

    base: Path
    cache: Path
    subs: dict[str, str]

    def sub(self, text: str) -> str:
        for k, v in self.subs.items():
            text = text.replace(k, v)
        return text

    def files(self, files: Mapping[str, str | None]) -> dict[str, str | None]:
        return {self.sub(k): None if v is None else self.sub(v) for k, v in files.items()}

    def env(self, values: Mapping[str, str], *, cache_off: bool = False) -> dict[str, str]:
        env = base_env(self.cache, **{k: self.sub(v) for k, v in values.items()})
        if (self.base / "bin").is_dir():
            env = with_path(env, self.base / "bin")
        if cache_off:
            env["METRALE_ORCH_CACHE_MODE"] = "off"
            env["METRALE_ORCH_LOCAL_CACHE"] = str(self.base / "no-cache")
        return env


def _refusal(run: Run, names: tuple[str, ...]) -> str:
    """'' when ``run`` is a clean refusal naming one of ``names``; else why not."""
    if run.returncode == 0:
        return "exit 0"
    if "Traceback" in run.out + run.err:
        return "a traceback instead of a one-line error"
    if any(w in run.out + run.err for w in ("fatal error", "compiler exited")):
        return "the compiler failed: that is no refusal"
    if not any(name in line for line in run.lines for name in names):
        return f"no error line names any of {names}"
    return ""


def _verdict(
    label: str,
    run: Run,
    got: dict[str, bytes],
    clean: Run,
    want: dict[str, bytes],
    m: Mutation,
    names: tuple[str, ...],
) -> tuple[str, str]:
    """(kind, problem) for one of the (a)/(b) builds: kind is held, refused, wrong or bad."""
    if clean.returncode != 0:
        if run.returncode != 0 and m.outside and not _refusal(run, names):
            return "refused", ""
        if run.returncode == 0:
            return "bad", f"({label}) exit 0 while the clean build refused:\n{clean.text}"
        return "bad", f"({label}) and the clean build both failed:\n{run.text}\n{clean.text}"
    if run.returncode != 0:
        why = _refusal(run, names) if m.outside else "a refusal is not allowed for this input"
        if m.outside and not why:
            return "refused", ""
        return "bad", f"({label}) failed ({why}):\n{run.text}"
    diff = diff_outputs(got, want)
    if diff:
        return "wrong", f"({label}) WRONG HIT: exit 0, output differs from the clean build:\n{diff}"
    return "held", ""


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One local cache for the module; each case's sources carry its id, so no key is shared
    # between cases (a mistake in one case can never feed another).
    return tmp_path_factory.mktemp("wrong-hits-cache")


@pytest.mark.nvcc
@pytest.mark.parametrize("m", CASES, ids=[c.id for c in CASES])
def test_mutation_never_yields_a_wrong_hit(m: Mutation, tmp_path: Path, cache_root: Path) -> None:
    ext = tmp_path / "ext"
    ext.mkdir()
    case = Case(
        tmp_path,
        cache_root,
        {
            "@EXTREL@": str(ext).lstrip("/"),
            "@EXT@": str(ext),
            "@NVCC@": REAL_NVCC,
            "@GCC@": REAL_GCC,
        },
    )
    names = tuple(case.sub(n) for n in m.names)
    marker = f"// wrong-hit case: {m.id}\n"
    # Each case's sources carry its id: no key is shared between cases on the common cache.
    tree, edits = (
        {
            k: (marker + v if v is not None and k.endswith(".cu") else v)
            for k, v in case.files(files).items()
        }
        for files in (m.files, m.edits)
    )

    # Before: build checkout A with the cache on (its entries are what a wrong hit would serve).
    write_files(tmp_path, case.files(m.outside_before), dodo=False)
    a = write_files(tmp_path / "A", tree)
    before = doit_run(a, ["build"], case.env(m.env_before))
    if before.returncode != 0 and not (m.outside and not _refusal(before, names)):
        pytest.fail(f"the project before the mutation does not build:\n{before.text}")
    was = artefacts(a)

    # The mutation, then (a) rebuild A and (c) a clean cache-off build of a copy, together.
    write_files(tmp_path, case.files(m.outside_after), dodo=False)
    write_files(a, edits)
    c = copy_project(a, tmp_path / "C")
    env = case.env(m.env_after)
    run_a, clean = doit_runs(
        [(a, ["build"], env), (c, ["build"], case.env(m.env_after, cache_off=True))]
    )
    # (b) a fresh checkout on the same cache, after (a) had its chance to store.
    b = copy_project(c, tmp_path / "B")
    run_b = doit_run(b, ["build"], env)

    want = outputs(c)
    verdicts = [
        _verdict("a: same checkout", run_a, outputs(a), clean, want, m, names),
        _verdict("b: fresh checkout", run_b, outputs(b), clean, want, m, names),
    ]
    kinds = {kind for kind, _ in verdicts}
    problems = [p for _, p in verdicts if p]
    if "wrong" in kinds:
        RESULTS[m.id] = "wrong"
    elif problems:
        RESULTS[m.id] = "bad"
    elif clean.returncode == 0 and artefacts(c) == was and before.returncode == 0:
        # Checked after the verdicts: an inert mutation still must not be served wrongly.
        RESULTS[m.id] = "inert"
        if m.inert_reason:
            return  # no wrong hit either way; not counted among the mutations (see the summary)
        pytest.fail(f"{m.id}: the mutation changes no clean artefact, so the case proves nothing")
    else:
        RESULTS[m.id] = "refused" if "refused" in kinds else "held"
    assert not problems, f"{m.id}:\n" + "\n\n".join(problems)


@pytest.mark.nvcc
def test_wrong_hit_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs last: the line BENCHMARKS.md quotes. Fails when any mutation was served wrongly."""
    counted = {k: v for k, v in RESULTS.items() if v != "inert"}
    if not counted:
        pytest.skip("no mutation case ran")
    wrong = sorted(k for k, v in counted.items() if v == "wrong")
    line = f"wrong hits: {len(wrong)} of {len(counted)} mutations"
    with capsys.disabled():
        print(f"\n{line}" + (f" ({', '.join(wrong)})" if wrong else ""))
    assert not wrong, line + ": " + ", ".join(wrong)
