"""Toolchains: definitions, overrides, selection, discovery, identity probing.

These are the tests of this topic that start processes; the others are in
``tests/unit/toolchain/test_toolchains.py``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from metrale_orch.steps.errors import ToolchainError
from metrale_orch.toolchain.definitions import builtin_toolchains
from metrale_orch.toolchain.probe import (
    ProbeMemo,
    find_toolchain,
    probe_toolchain,
)
from metrale_orch.toolchain.stamps import toolchain_stamps
from tests.support.build import fake_toolchain_env
from tests.support.toolchain import _exe


def test_a_new_build_directory_takes_the_toolkit_hashes_from_the_users_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh state directory (a new clone, ``rm -rf build``) reads no binary the
    user's ``toolchain-hashes.json`` holds by the same stamp; a changed binary is read."""
    from metrale_orch import fsutil
    from metrale_orch.toolchain import probe as probe_mod

    env = fake_toolchain_env(tmp_path / "bin")
    # A binary changed within the racy window of its reading is not remembered ...
    probe_toolchain(
        builtin_toolchains()["nvcc"], tmp_path / "bin/nvcc", env, state_dir=tmp_path / "z"
    )
    assert not (tmp_path / ".cache/metrale-orch-probes/toolchain-hashes.json").exists()
    assert not (tmp_path / "z/file-hashes.json").exists()
    # ... the rest of this test trusts every stamp at once.
    monkeypatch.setattr(fsutil, "RACY_NS", 0)
    nvcc = builtin_toolchains()["nvcc"]
    program = tmp_path / "bin/nvcc"
    read: list[str] = []
    real_hash = probe_mod.file_hash

    def counting(path: str) -> str:
        read.append(path)
        return real_hash(path)

    monkeypatch.setattr(probe_mod, "file_hash", counting)
    first = probe_toolchain(nvcc, program, env, state_dir=tmp_path / "a").identity
    assert str(program.resolve()) in read
    shared = json.loads((tmp_path / ".cache/metrale-orch-probes/toolchain-hashes.json").read_text())
    assert str(program.resolve()) in shared
    read.clear()
    assert probe_toolchain(nvcc, program, env, state_dir=tmp_path / "b").identity == first
    assert read == []  # every hash from the user's file
    assert str(program.resolve()) in json.loads((tmp_path / "b/file-hashes.json").read_text())
    # The same bytes written again: another stamp, read again (and the same identity).
    program.write_bytes(program.read_bytes())
    assert probe_toolchain(nvcc, program, env, state_dir=tmp_path / "c").identity == first
    assert read == [str(program.resolve())]
    # Other bytes: another identity, read again.
    program.write_text(program.read_text() + "\n# another build of it\n")
    read.clear()
    other = probe_toolchain(nvcc, program, env, state_dir=tmp_path / "d").identity
    assert other != first and read == [str(program.resolve())]
    # A damaged file is only a miss.
    (tmp_path / ".cache/metrale-orch-probes/toolchain-hashes.json").write_text("{")
    assert probe_toolchain(nvcc, program, env, state_dir=tmp_path / "e").identity == other


def test_probe_runs_once_per_run_and_sees_every_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metrale_orch import fsutil

    monkeypatch.setattr(fsutil, "RACY_NS", 0)  # the fakes were just written: trust them
    env = fake_toolchain_env(tmp_path / "bin")
    nvcc = builtin_toolchains()["nvcc"]
    program = tmp_path / "bin/nvcc"
    state = tmp_path / "state"
    run = ProbeMemo()
    ident = probe_toolchain(nvcc, program, env, state_dir=state, memo=run).identity
    assert "Cuda compilation tools, release 99.0" in ident
    assert "host: gcc (Fake) 12.2.0" in ident
    assert "Copyright" not in ident
    # Only the binaries' content hashes are remembered across processes.
    hashes = json.loads((state / "file-hashes.json").read_text())
    assert str(program.resolve()) in hashes
    # Within a run the probe is not repeated ...
    env["FAKE_NVCC_VERSION"] = "-changed"
    assert probe_toolchain(nvcc, program, env, state_dir=state, memo=run).identity == ident
    # ... but a new run probes again: the fakes were just written, so no record of this
    # probe was kept (tests/scenarios/toolchain/test_probe_records.py: what a settled record
    # spares).
    assert not list((state / "probes").glob("*.json"))
    changed = probe_toolchain(nvcc, program, env, state_dir=state, memo=ProbeMemo()).identity
    assert changed != ident and "release 99.0-changed" in changed
    # What the dry run shows (e.g. a flag a wrapper adds) is part of the identity.
    dry = probe_toolchain(nvcc, program, {**env, "FAKE_NVCC_DRYRUN": "-DWRAPPED=1"}).identity
    assert dry != changed
    # So is the host compiler's content, with the same --version output.
    gcc = tmp_path / "bin/gcc"
    gcc.write_text(gcc.read_text() + "# a wrapper that adds -DX\n")
    assert probe_toolchain(nvcc, program, env).identity != changed
    # A keyed environment variable (NVCC_*, CPATH ...) too.
    assert (
        probe_toolchain(nvcc, program, {**env, "CPATH": "/x"}).identity
        != probe_toolchain(nvcc, program, env).identity
    )


def _wrapper(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.nvcc
def test_real_nvcc_seen_through_a_wrapper(tmp_path: Path) -> None:
    """A wrapper ``nvcc`` whose bytes never change but whose real compiler (picked by an
    environment variable, like asdf/pyenv shims) or added flags do: the identity moves."""
    import os
    import shutil

    real = shutil.which("nvcc")
    assert real is not None
    nvcc = builtin_toolchains()["nvcc"]
    wrapper = _wrapper(tmp_path / "w/nvcc", f'exec {real} ${{METRALE_TEST_WRAP_FLAGS:-}} "$@"\n')
    env = dict(os.environ)
    base = find_toolchain(nvcc, env, site_dirs=[])
    assert base.roots and all(Path(r).is_absolute() for r in base.roots)
    plain = probe_toolchain(nvcc, wrapper, env).identity
    flagged = probe_toolchain(
        nvcc, wrapper, {**env, "METRALE_TEST_WRAP_FLAGS": "-DWRAPPED=1"}
    ).identity
    assert plain != flagged
    assert probe_toolchain(nvcc, wrapper, env).identity == plain  # deterministic


def test_probe_failure_is_a_toolchain_error(tmp_path: Path) -> None:
    env = fake_toolchain_env(tmp_path / "bin")
    bad = _exe(tmp_path / "bin/nvcc")
    bad.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    with pytest.raises(ToolchainError, match=r"version probe failed.*exited with status 3"):
        probe_toolchain(builtin_toolchains()["nvcc"], bad, env)


def test_host_compiler_from_nvcc_ccbin_file_or_directory(tmp_path: Path) -> None:
    env = fake_toolchain_env(tmp_path / "bin")
    nvcc = builtin_toolchains()["nvcc"]
    other = _exe(tmp_path / "gcc13/gcc")
    other.write_text("#!/bin/sh\necho 'gcc (Other) 13.1.0'\n")
    for ccbin in (str(other), str(other.parent)):
        ident = probe_toolchain(nvcc, tmp_path / "bin/nvcc", {**env, "NVCC_CCBIN": ccbin}).identity
        assert " | host: gcc (Other) 13.1.0 | " in ident


def test_every_toolchain_is_probed_at_the_same_time(tmp_path: Path) -> None:
    """The stamps of a run's toolchains are probed together, not one after another
    (the no-op build waited for their sum): the probes' version runs overlap."""
    log = tmp_path / "probes.log"
    env = fake_toolchain_env(tmp_path / "bin")
    slow = tmp_path / "bin/slowcc"
    slow.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        f"log = open({str(log)!r}, 'a')\n"
        "log.write(f'start {os.getpid()} {time.time()}\\n'); log.flush()\n"
        "time.sleep(0.5)\n"
        "log.write(f'end {os.getpid()} {time.time()}\\n'); log.close()\n"
        "print('slowcc 1.0')\n"
    )
    slow.chmod(0o755)
    base = builtin_toolchains()["nvcc"]
    tcs = {
        f"slow{i}": dataclasses.replace(
            base,
            name=f"slow{i}",
            program="slowcc",
            dryrun_args=(),
            host_compiler="",
            host_compiler_env="",
            program_env=(),
            program_paths=(),
            version_args=(f"-v{i}",),
        )
        for i in range(3)
    }
    stamps = toolchain_stamps(tcs, env, memo=ProbeMemo())
    assert sorted(stamps) == ["slow0", "slow1", "slow2"]
    assert all(s[0] == "found" for s in stamps.values()), stamps
    events = [line.split() for line in log.read_text().splitlines()]
    starts = sorted(float(t) for kind, _, t in events if kind == "start")
    ends = sorted(float(t) for kind, _, t in events if kind == "end")
    assert len(starts) == 3
    assert starts[-1] < ends[0], "the probes ran one after another"
