"""Probe records: a later run runs only the dry runs, and anything they or the files they
lead to show changed runs the full probe again (metrale_orch.toolchain.records)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import metrale_orch.toolchain.records as records
from metrale_orch.toolchain.probe import ProbeMemo, probe_toolchain
from tests.support.toolchain import NVCC, _setup


@pytest.fixture(autouse=True)
def _settled_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files the test just wrote count as settled (the rule itself has its own test)."""
    monkeypatch.setattr(records, "RACY_NS", 0)


def _probe(tmp_path: Path, env: dict[str, str]) -> tuple[str, list[str]]:
    """A new run's probe (identity, the commands it ran)."""
    log = tmp_path / "probe.log"
    log.write_text("")
    probe = probe_toolchain(
        NVCC, tmp_path / "bin" / "nvcc", env, state_dir=tmp_path / "state", memo=ProbeMemo()
    )
    return probe.identity, sorted(log.read_text().splitlines())


FULL = 5  # nvcc --version, --dryrun; gcc --version, -###, -E -Wp,-v


def _is_full(ran: list[str]) -> bool:
    return len(ran) == FULL and any("--version" in r for r in ran)


def test_a_later_run_runs_only_the_dry_runs_and_gets_the_same_identity(tmp_path: Path) -> None:
    env = _setup(tmp_path)
    first, ran = _probe(tmp_path, env)
    assert _is_full(ran), ran
    assert list((tmp_path / "state" / records.RECORDS_DIR).glob("*.json"))
    again, ran = _probe(tmp_path, env)
    assert again == first
    assert len(ran) == 2 and all("--version" not in r and "-Wp,-v" not in r for r in ran), ran
    assert sorted(r.split()[0] for r in ran) == ["gcc", "nvcc"]


def _same_size_edit(path: Path, old: str, new: str) -> None:
    """Rewrite ``path`` with ``old`` replaced by ``new`` (same length) and its mtime put back."""
    assert len(old) == len(new)
    st = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


CHANGES: dict[str, Callable[[Path, dict[str, str]], object]] = {
    # A wrapper's added flag shows in the dry run (the variable is not keyed).
    "dry run": lambda t, env: env.update(FAKE_NVCC_DRYRUN="-DWRAPPED=1"),
    "host dry run": lambda t, env: env.update(FAKE_GCC_DRYRUN="-DHOST=1"),
    # A same-size edit with the mtime restored: ctime and content differ.
    "program content": lambda t, env: _same_size_edit(t / "bin" / "nvcc", "99.0", "98.0"),
    "host content": lambda t, env: _same_size_edit(t / "bin" / "gcc", "12.2.0", "12.3.0"),
    # A toolkit program the dry run's _HERE_ leads to appears.
    "toolkit program": lambda t, env: (t / "bin" / "ptxas").write_text("#!/bin/sh\n"),
    # A directory the host's search list ignored as nonexistent appears.
    "search directory": lambda t, env: (t / "new").mkdir(),
    # The program reached through a link that now points elsewhere.
    "link target": lambda t, env: _relink(t),
}


def _relink(tmp_path: Path) -> None:
    other = tmp_path / "bin" / "nvcc-other"
    other.write_text((tmp_path / "bin" / "nvcc").read_text().replace("99.0", "97.0"))
    other.chmod(0o755)
    (tmp_path / "bin" / "nvcc").unlink()
    (tmp_path / "bin" / "nvcc").symlink_to(other.name)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_the_record_cannot_vouch_for_runs_the_full_probe(
    tmp_path: Path, change: str
) -> None:
    env = _setup(tmp_path)
    first, _ran = _probe(tmp_path, env)
    CHANGES[change](tmp_path, env)
    seen, ran = _probe(tmp_path, env)
    assert _is_full(ran), f"{change}: only {ran}"
    if change not in ("toolkit program", "search directory"):
        assert seen != first, f"{change}: same identity"
    # ... and records what it found: the next run needs only the dry runs again.
    again, ran = _probe(tmp_path, env)
    assert again == seen and len(ran) == 2, (change, ran)


def test_a_changed_search_list_reaches_the_identity_and_the_system_dirs(tmp_path: Path) -> None:
    env = _setup(tmp_path)
    probe = probe_toolchain(NVCC, tmp_path / "bin" / "nvcc", env, state_dir=tmp_path / "state")
    assert probe.system_dirs == (str(tmp_path / "inc"),)
    (tmp_path / "new").mkdir()
    probe = probe_toolchain(NVCC, tmp_path / "bin" / "nvcc", env, state_dir=tmp_path / "state")
    assert probe.system_dirs == (str(tmp_path / "inc"), str(tmp_path / "new"))


def test_a_record_of_files_changed_within_the_racy_window_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "RACY_NS", 3600 * 10**9)  # every file is "just written"
    env = _setup(tmp_path)
    _probe(tmp_path, env)
    assert not list((tmp_path / "state").glob(f"{records.RECORDS_DIR}/*.json"))
    _identity, ran = _probe(tmp_path, env)
    assert _is_full(ran), ran


@pytest.mark.parametrize("damage", ["garbage", "other shape", "other identity code"])
def test_an_unreadable_or_foreign_record_runs_the_full_probe(tmp_path: Path, damage: str) -> None:
    env = _setup(tmp_path)
    first, _ran = _probe(tmp_path, env)
    (path,) = (tmp_path / "state" / records.RECORDS_DIR).glob("*.json")
    if damage == "garbage":
        path.write_text("{not json")
    elif damage == "other shape":
        path.write_text(json.dumps({"schema": 1, "witness": []}))
    else:  # a record made by other code of the package sits under another name
        path.rename(path.with_name("0" * 32 + ".json"))
    again, ran = _probe(tmp_path, env)
    assert again == first and _is_full(ran), ran


def test_records_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "MAX_RECORDS", 3)
    env = _setup(tmp_path)
    for i in range(6):  # six keyed environments: six probes, six records made
        _probe(tmp_path, {**env, "NVCC_APPEND_FLAGS": f"-DI={i}"})
    assert len(list((tmp_path / "state" / records.RECORDS_DIR).glob("*.json"))) == 3


def test_without_a_dry_run_every_run_probes_in_full(tmp_path: Path) -> None:
    from dataclasses import replace

    env = _setup(tmp_path)
    plain = replace(NVCC, dryrun_args=())
    for _ in range(2):
        (tmp_path / "probe.log").write_text("")
        probe_toolchain(plain, tmp_path / "bin" / "nvcc", env, state_dir=tmp_path / "state")
        ran = (tmp_path / "probe.log").read_text().splitlines()
        assert any("--version" in r for r in ran), ran
