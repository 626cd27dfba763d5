"""The build-task cache (``tasks.taskcache`` through ``tasks.specs.cached_build_specs``).

Every test compares the cached answer with a fresh generation, or proves a
change makes the next lookup miss. Most run in-process against the project of
``tests.support.project`` with its recording fake compiler; ``RACY_NS`` is set to
0 where a test needs stats to be trusted right after writing files (the real
2 s window is exercised by the doit runs of ``tests/scenarios/tasks/test_dodo.py`` and below).

The tests of this topic that run in-process are in ``tests/unit/tasks/test_taskcache.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from metrale_orch.config import load_config
from metrale_orch.graph import taskcache
from metrale_orch.graph.generate import GENERATION, resolve_build_specs
from metrale_orch.graph.scope import in_scope
from metrale_orch.graph.specs import BuildSpec
from metrale_orch.graph.taskkey import generation_base, generation_key
from metrale_orch.paths import TREE_TASK
from metrale_orch.tasks.creators import cached_tasks
from metrale_orch.tasks.doit_api import doit_version
from metrale_orch.tasks.smoke import smoke_task_dicts
from metrale_orch.tasks.specs import cached_build_specs
from metrale_orch.toolchain import earlyruns
from metrale_orch.toolchain.definitions import load_toolchains
from tests.support.project import doit
from tests.support.tasks import _one_spec

STATE = Path("build/.state")


def entries(root: Path) -> list[Path]:
    """The task cache files of the project."""
    return sorted((root / STATE).glob(taskcache.CACHE_GLOB))


def cache_file(root: Path, env: dict[str, str]) -> Path:
    return taskcache.cache_path(root / STATE, _key(root, env))


@pytest.fixture
def trusting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trust stats taken any time before the scan (no racy window)."""
    monkeypatch.setattr(taskcache, "RACY_NS", 0)


def norm(specs: list[BuildSpec]) -> list[tuple[str, str, str, str]]:
    """The specs in a comparable form: what their task dicts are made of."""
    return [
        (
            s.target,
            s.kind,
            s.message,
            repr((s.file_dep, sorted(s.parts.items()), s.manifest, s.explicit, s.clean)),
        )
        for s in specs
    ]


def lookup(root: Path, env: dict[str, str], argv: tuple[str, ...] = ()) -> str:
    """How the next cached_build_specs got its answer; asserts it equals a fresh one."""
    got, how = cached_build_specs(root, env, argv)
    assert norm(got) == norm(resolve_build_specs(root, env, argv))
    return how


def primed(root: Path, env: dict[str, str]) -> None:
    assert lookup(root, env) == "no cache file"
    assert cache_file(root, env).is_file()
    assert lookup(root, env) == "hit"


# ------------------------------------------------------------------------------ hits


def test_hit_equals_generation_including_skips_errors_and_smoke(
    fake_project: tuple[Path, dict[str, str]], trusting: None
) -> None:
    root, env = fake_project
    # A tree error (undeclared shadow) too: error tasks are cached and replayed.
    (root / "kernels/hopper/qwen/w8/add.cu").write_text('extern "C" __global__ void a() {}\n')
    primed(root, env)
    got, how = cached_build_specs(root, env)
    assert how == "hit"
    kinds = {s.target: s.kind for s in got}
    assert kinds["apple/llama/f16"] == "skip" and kinds["hopper/qwen/w8"] == "error"
    assert kinds["hopper/qwen/w4"] == "build"
    fresh = resolve_build_specs(root, env)
    # The smoke tasks are replayed (same dicts, same action functions), not recomputed.
    _specs, replayed, how = cached_tasks(root, env, (), lambda: GENERATION)
    assert how == "hit" and replayed is not None
    assert repr(replayed) == repr(smoke_task_dicts(root, env, fresh)) != "[]"


def test_hit_honours_the_command_line(
    fake_project: tuple[Path, dict[str, str]], trusting: None
) -> None:
    root, env = fake_project
    primed(root, env)
    # An explicit selection of a target without a toolchain fails; a broad one skips.
    argv = ("build:apple/llama/f16",)
    assert lookup(root, env, argv) == "hit"
    (skip,) = [s for s in cached_build_specs(root, env, argv)[0] if s.kind == "skip"]
    assert skip.explicit is True
    (skip,) = [s for s in cached_build_specs(root, env, ("build",))[0] if s.kind == "skip"]
    assert skip.explicit is False


def test_same_bytes_touch_is_a_hit_by_content_then_stat_only(
    fake_project: tuple[Path, dict[str, str]], trusting: None
) -> None:
    root, env = fake_project
    primed(root, env)
    for path in (root / "kernels").rglob("*.toml"):
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**12))
    first = taskcache.lookup(cache_file(root, env), _key(root, env))
    assert first.reason == "hit" and first.compared == 6 and first.refreshed
    second = taskcache.lookup(cache_file(root, env), _key(root, env))
    assert second.reason == "hit" and second.compared == 0 and not second.refreshed


def test_unrelated_environment_and_kernel_source_edits_keep_the_cache(
    fake_project: tuple[Path, dict[str, str]], trusting: None
) -> None:
    root, env = fake_project
    primed(root, env)
    assert lookup(root, {**env, "SOMETHING_ELSE": "1"}) == "hit"
    # Source content reaches the tasks only through file_dep (doit's checker sees it).
    (root / "kernels/hopper/common/add.cu").write_text("// edited\n")
    assert lookup(root, env) == "hit"


# ------------------------------------------------------------------------------ misses


@pytest.mark.parametrize(
    "change",
    ["add", "remove", "rename", "add-dir", "subdir-file"],
)
def test_tree_shape_changes_miss(
    fake_project: tuple[Path, dict[str, str]], trusting: None, change: str
) -> None:
    root, env = fake_project
    k = root / "kernels"
    (k / "hopper/common/vendor").mkdir()
    (k / "hopper/common/vendor/v.h").write_text("// v\n")
    primed(root, env)
    if change == "add":
        (k / "hopper/qwen/w8/new.cu").write_text('extern "C" __global__ void n() {}\n')
    elif change == "remove":
        (k / "hopper/qwen/w8/mul.cu").unlink()
    elif change == "rename":
        (k / "hopper/qwen/w8/mul.cu").rename(k / "hopper/qwen/w8/mul2.cu")
    elif change == "add-dir":
        (k / "hopper/llama/w4").mkdir(parents=True)
    else:
        (k / "hopper/common/vendor/w.h").write_text("// w\n")
    how = lookup(root, env)
    assert how.startswith("changed: "), how
    assert lookup(root, env) == "hit"


@pytest.mark.parametrize("how", ["new-mtime", "restored-mtime"])
def test_manifest_edits_miss(
    fake_project: tuple[Path, dict[str, str]], trusting: None, how: str
) -> None:
    root, env = fake_project
    primed(root, env)
    before_parts = _parts(cached_build_specs(root, env)[0])
    hw = root / "kernels/hopper/HARDWARE.toml"
    before = hw.stat()
    text = hw.read_text()
    edited = text.replace("lm_head_batchm_max = 8", "lm_head_batchm_max = 4")
    assert len(edited) == len(text) and edited != text
    hw.write_text(edited)
    if how == "restored-mtime":
        os.utime(hw, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert hw.stat().st_mtime_ns == before.st_mtime_ns
        assert hw.stat().st_size == before.st_size
    assert lookup(root, env) == f"changed: {hw}"
    after_parts = _parts(cached_build_specs(root, env)[0])
    assert before_parts["hopper/qwen/w4"]["defaults"] != after_parts["hopper/qwen/w4"]["defaults"]
    assert lookup(root, env) == "hit"


def _parts(specs: list[BuildSpec]) -> dict[str, dict[str, str]]:
    return {s.target: dict(s.parts) for s in specs if s.kind == "build"}


@pytest.mark.parametrize(
    "change",
    ["config-env", "allowlisted-env", "pyproject", "toolchain-file", "program", "path"],
)
def test_key_changes_miss(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path, change: str
) -> None:
    root, env = fake_project
    tc = root / "toolchains/nvcc.toml"
    tc.write_text(
        tc.read_text().replace("[toolchain]", '[toolchain]\nenv_allowlist = ["FAKE_OPT"]')
    )
    primed(root, env)
    original = dict(env)
    if change == "config-env":
        env = {**env, "METRALE_ORCH_CACHE_NAMESPACE": "other"}
    elif change == "allowlisted-env":
        env = {**env, "FAKE_OPT": "1"}
    elif change == "pyproject":
        (root / "pyproject.toml").write_text('[tool.metrale-orch]\ncache_namespace = "x"\n')
    elif change == "toolchain-file":
        tc.write_text(tc.read_text().replace("the fake compiler", "a fake compiler"))
    elif change == "program":
        fake = tmp_path / "bin/fakecc"
        fake.write_text(fake.read_text() + "\n# rebuilt\n")
    else:
        env = {**env, "PATH": f"{tmp_path / 'elsewhere'}{os.pathsep}{env['PATH']}"}
    # Another key is another entry: this one misses, the first stays for its environment.
    assert lookup(root, env) == "no cache file", change
    assert lookup(root, env) == "hit"
    if change in ("config-env", "allowlisted-env", "path"):
        assert lookup(root, original) == "hit"
        assert len(entries(root)) == 2


def test_entries_beyond_keep_are_removed(
    fake_project: tuple[Path, dict[str, str]], trusting: None
) -> None:
    root, env = fake_project
    for i in range(taskcache.KEEP + 2):
        assert lookup(root, {**env, "METRALE_ORCH_CACHE_NAMESPACE": str(i)}) == "no cache file"
    assert len(entries(root)) == taskcache.KEEP
    newest = {**env, "METRALE_ORCH_CACHE_NAMESPACE": str(taskcache.KEEP + 1)}
    assert lookup(root, newest) == "hit"


def test_a_symlink_in_the_tree_is_never_cached(
    fake_project: tuple[Path, dict[str, str]], trusting: None
) -> None:
    root, env = fake_project
    (root / "kernels/hopper/qwen/w8/link.cu").symlink_to(root / "kernels/hopper/qwen/w8/mul.cu")
    assert lookup(root, env) == "no cache file"
    assert not entries(root)


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("kernels/hopper/qwen/MODEL.toml", '[model]\nkernel_source = "../../../outside"\n'),
        ("kernels/gb10/HARDWARE.toml", '[hardware]\nvendor = "nvidia"\ninherits = "../x/hopper"\n'),
    ],
)
def test_manifests_naming_paths_are_never_cached(
    fake_project: tuple[Path, dict[str, str]], trusting: None, rel: str, text: str
) -> None:
    root, env = fake_project
    (root / rel).write_text(text)
    assert lookup(root, env) == "no cache file"
    assert not entries(root)


@pytest.mark.parametrize("what", ["file", "kernels"])
def test_a_symlink_replacing_a_watched_item_misses(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path, what: str
) -> None:
    root, env = fake_project
    primed(root, env)
    if what == "file":
        # Same name, same bytes behind it: the resolver refuses links, the cache must see it.
        target = root / "kernels/hopper/qwen/MODEL.toml"
        copy = tmp_path / "MODEL.toml"
        copy.write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(copy)
    else:
        kernels = root / "kernels"
        kernels.rename(tmp_path / "real-kernels")
        kernels.symlink_to(tmp_path / "real-kernels")
    assert lookup(root, env).startswith("changed: ")


def test_failed_probe_and_config_errors_are_not_cached(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path, trusting: None
) -> None:
    root, env = fake_project
    (tmp_path / "bin/fakecc").write_text("#!/bin/sh\nexit 3\n")
    specs, how = cached_build_specs(root, env)
    assert how == "no cache file" and not entries(root)
    assert {s.kind for s in specs if s.target.startswith("hopper/")} == {"error"}
    (root / "pyproject.toml").write_text("[tool.metrale-orch]\nbuild_dir = 3\n")
    specs, how = cached_build_specs(root, env)
    assert how.startswith("not cached") and [s.target for s in specs] == [TREE_TASK]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "body-byte", "header-byte"])
def test_damaged_cache_files_miss(
    fake_project: tuple[Path, dict[str, str]], trusting: None, damage: str
) -> None:
    root, env = fake_project
    primed(root, env)
    path = cache_file(root, env)
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"\x00not a cache\n" * 3)
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "body-byte":
        data[-10] ^= 0x01
    else:
        data[len(data) // 50] ^= 0x01
    path.write_bytes(bytes(data))
    assert lookup(root, env) != "hit"
    assert lookup(root, env) == "hit"  # rewritten by the miss


# ------------------------------------------------------------------------------ the racy rule


def _key(root: Path, env: dict[str, str]) -> str:

    return generation_key(
        root, env, load_config(root, env), load_toolchains(root), doit=doit_version()
    )


def test_package_files_are_watched(tmp_path: Path, trusting: None) -> None:
    tree = tmp_path / "kernels"
    tree.mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.parent.mkdir()
    module.write_text("A = 1\n")
    assert taskcache.package_files(module.parent) == [module]
    scanned = taskcache.scan(tree, [module])
    assert scanned is not None
    taskcache.store(tmp_path / "c", "k", scanned, _one_spec())
    assert taskcache.lookup(tmp_path / "c", "k").reason == "hit"
    module.write_text("A = 2\n")
    assert taskcache.lookup(tmp_path / "c", "k").reason == f"changed: {module}"


# ------------------------------------------------------------------------------ which programs


SPARE_TOOLCHAIN = """\
[toolchain]
name = "spare"
vendors = ["nobody"]
program = "sparecc"
install_hint = "a toolchain no target of the tree selects"
version_args = ["--version"]
output = "ptx"
argv = ["{program}", "{source}", "-o", "{output}"]
"""


def _spare(root: Path, bin_dir: Path, version: str) -> Path:
    """A project toolchain claiming a vendor no hardware has; its compiler logs each run."""
    (root / "toolchains/spare.toml").write_text(SPARE_TOOLCHAIN)
    program = bin_dir / "sparecc"
    program.write_text(f'#!/bin/sh\necho run >> "{bin_dir}/spare.log"\necho "spare {version}"\n')
    program.chmod(0o755)
    return bin_dir / "spare.log"


def test_a_toolchain_no_target_selects_is_not_probed_and_changes_nothing(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path
) -> None:
    """The key holds the programs of the toolchains the targets select: another one
    (hipcc beside a tree of NVIDIA targets) is neither probed nor able to miss."""
    root, env = fake_project
    log = _spare(root, tmp_path / "bin", "1.0")
    primed(root, env)
    state = root / STATE
    assert taskcache.read_uses(state, _base(root, env)) == ("metal", "nvcc")
    # Not even the first generation ran it: it resolves the tree before any probe.
    assert not log.exists()
    assert lookup(root, env) == "hit"
    assert not log.exists()  # neither the key nor the generation ran it
    _spare(root, tmp_path / "bin", "2.0")  # another compiler: no target uses it
    assert lookup(root, env) == "hit" and not log.exists()
    (tmp_path / "bin/sparecc").unlink()  # gone: still nothing selects it
    assert lookup(root, env) == "hit"


def _base(root: Path, env: dict[str, str]) -> str:
    return generation_base(
        root, env, load_config(root, env), load_toolchains(root), doit=doit_version()
    )


def test_a_toolchain_a_skipped_target_selects_is_still_probed(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path
) -> None:
    """A target skipped because its compiler is missing selects that toolchain: the
    compiler appearing misses (the skip may become a build), however it answers."""
    root, env = fake_project
    primed(root, env)
    xcrun = tmp_path / "bin/xcrun"
    xcrun.write_text('#!/bin/sh\necho "Apple metal version 32023.1"\n')
    xcrun.chmod(0o755)
    assert lookup(root, env) != "hit"


def test_the_key_stored_last_is_only_a_hint(
    fake_project: tuple[Path, dict[str, str]], trusting: None
) -> None:
    """The entry a base stored last is read before the toolchains are stamped, but only the
    stamps' key answers: a hint naming another entry, a missing one or none still finds
    the entry of the key (and a generation is still the same generation)."""
    root, env = fake_project
    primed(root, env)
    state = root / STATE
    uses = state / taskcache.USES_NAME
    doc = json.loads(uses.read_text())
    (base,) = doc
    stored = doc[base]["key"]
    assert stored == _key(root, env)
    for hint in ("0" * 32, None):
        doc[base]["key"] = hint
        uses.write_text(json.dumps(doc))
        assert lookup(root, env) == "hit", hint
        # ... and the hint names the entry again, so the next run reads it first.
        assert taskcache.last_key(state, base) == stored, hint
    # An entry whose watches no longer hold is the hint's miss and the key's: regenerated.
    hw = root / "kernels/hopper/HARDWARE.toml"
    hw.write_text(hw.read_text() + "\n# edited\n")
    assert lookup(root, env).startswith("changed")
    assert taskcache.last_key(state, base) == _key(root, env)


# ------------------------------------------------------------------------------ real doit runs


def test_doit_runs_use_the_cache_and_see_changes(fake_project: tuple[Path, dict[str, str]]) -> None:
    root, env = fake_project
    first = doit(root, ["build"], env)
    assert first.returncode == 0, first.text
    (entry,) = entries(root)
    stamp = entry.stat().st_mtime_ns
    noop = doit(root, ["build"], env)
    assert noop.returncode == 0 and "0 built" in noop.out, noop.text
    # An explicit selection of a target without a toolchain fails (a run of that target
    # alone: its own scoped entry, beside the whole tree's).
    explicit = doit(root, ["build:apple/llama/f16"], env)
    assert explicit.returncode == 1, explicit.text
    assert "toolchain 'metal' is not installed" in explicit.out
    assert len(entries(root)) == 2 and entry in entries(root)
    # A new file: regenerated (the cache is rewritten), exactly its targets build.
    (root / "kernels/hopper/qwen/w8/new.cu").write_text('extern "C" __global__ void n() {}\n')
    run = doit(root, ["build"], env)
    assert run.returncode == 0, run.text
    assert "[1/" in run.out and "build:hopper/qwen/w8" in run.out and "2 built" in run.out
    assert entry in entries(root) and entry.stat().st_mtime_ns != stamp
    listing = doit(root, ["list", "--all", "--status"], env)
    assert listing.returncode == 0 and "smoke:hopper" in listing.out, listing.text


def test_a_compiler_put_first_on_path_while_generating_is_not_keyed_as_seen(
    fake_project: tuple[Path, dict[str, str]],
    trusting: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The entry is keyed by the toolchains as they were before generation read anything:
    another compiler put first on PATH while the targets were planned (their plans carry
    the old one's identity) makes the next run miss, not hit those plans."""
    root, env = fake_project
    first = tmp_path / "first-bin"
    first.mkdir()
    env = {**env, "PATH": f"{first}{os.pathsep}{env['PATH']}"}
    generate = GENERATION.generate_specs
    installed: list[Path] = []

    def generate_then_install(*args: object, **kwargs: object) -> object:
        got = generate(*args, **kwargs)
        if not installed:  # a newer build of the compiler, first on PATH, mid-generation
            other = first / "fakecc"
            other.write_text((tmp_path / "bin" / "fakecc").read_text() + "\n# another build\n")
            other.chmod(0o755)
            installed.append(other)
        return got

    monkeypatch.setattr(
        "metrale_orch.tasks.specs.GENERATION",
        dataclasses.replace(GENERATION, generate_specs=generate_then_install),
    )
    # The first generation (no hint), by itself: a fresh one would see the new compiler.
    assert cached_build_specs(root, env, ())[1] == "no cache file"
    assert installed
    # Compared with a fresh generation inside lookup(): a hit would hand back plans
    # made for the compiler that is no longer the one on PATH.
    assert lookup(root, env) != "hit"
    assert lookup(root, env) == "hit"


def test_a_change_only_the_arch_s_dry_run_shows_misses(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path
) -> None:
    """A toolchain whose dry run names the arch (metal's ``-std=``, hip's
    ``--offload-arch=``) is probed per arch for its targets' plans: the key stamps those
    arches too, so a change only such a dry run shows (a wrapper that reads a file for
    one arch; one arch's device libraries) misses instead of replaying the old identity."""
    root, env = fake_project
    chosen = tmp_path / "arch-flags"
    chosen.write_text("-DX=1\n")
    xcrun = tmp_path / "bin/xcrun"
    xcrun.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *-std=*) echo "\\"/opt/metal/bin/metal\\" $(cat {chosen})";; esac\n'
        'echo "Apple metal version 32023.1"\n'
    )
    xcrun.chmod(0o755)
    primed(root, env)
    chosen.write_text("-DX=2\n")  # the arch-less dry run prints what it printed
    assert lookup(root, env) != "hit"
    assert lookup(root, env) == "hit"


def test_a_change_only_the_arch_less_dry_run_shows_misses(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path
) -> None:
    """A target without an arch, of a toolchain probed per arch, is planned with the probe
    without the arch: the key stamps that probe too (as the arch ``""``)."""
    root, env = fake_project
    chosen = tmp_path / "plain-flags"
    chosen.write_text("-DX=1\n")
    xcrun = tmp_path / "bin/xcrun"
    xcrun.write_text(
        "#!/bin/sh\n"
        'case "$*" in *-std=*) ;; *-###*) echo "\\"/opt/metal/bin/metal\\" $(cat '
        f'{chosen})";; esac\n'
        'echo "Apple metal version 32023.1"\n'
    )
    xcrun.chmod(0o755)
    for rel, text in (
        ("kernels/apple0/HARDWARE.toml", '[hardware]\nvendor = "apple"\n'),
        ("kernels/apple0/common/k.metal", "kernel void k() {}\n"),
        ("kernels/apple0/llama/MODEL.toml", "[model]\n"),
        ("kernels/apple0/llama/f16/.gitkeep", ""),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    primed(root, env)
    chosen.write_text("-DX=2\n")  # every arch's dry run prints what it printed
    assert lookup(root, env) != "hit"
    assert lookup(root, env) == "hit"


def test_a_tree_with_a_misshapen_layer_manifest_is_still_cached(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path
) -> None:
    """The arches stamped before generation are those of the targets as the build sees
    them (a layer manifest that is a directory fails its targets): the entry is stored."""
    root, env = fake_project
    xcrun = tmp_path / "bin/xcrun"
    xcrun.write_text('#!/bin/sh\necho "Apple metal version 32023.1"\n')
    xcrun.chmod(0o755)
    for rel, text in (
        ("kernels/apple2/HARDWARE.toml", '[hardware]\nvendor = "apple"\narch = "metal3.2"\n'),
        ("kernels/apple2/common/k.metal", "kernel void k() {}\n"),
        ("kernels/apple2/llama/MODEL.toml", "[model]\n"),
        ("kernels/apple2/llama/f16/.gitkeep", ""),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "kernels/apple2/common/KERNEL.toml").mkdir()
    primed(root, env)


# ------------------------------------------------------------------------------ scopes


def _logging_xcrun(bin_dir: Path) -> Path:
    """A stand-in ``xcrun`` (the apple target's toolchain) that logs every call."""
    log = bin_dir / "xcrun.log"
    xcrun = bin_dir / "xcrun"
    xcrun.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\necho "Apple metal version 32023.1"\n')
    xcrun.chmod(0o755)
    return log


def _scoped(
    root: Path, env: dict[str, str], scope: tuple[str, ...]
) -> tuple[list[BuildSpec], object, str]:
    return cached_tasks(root, env, scope, lambda: GENERATION, scope=scope)


def test_a_scoped_run_has_its_targets_specs_alone_and_probes_only_their_toolchains(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path
) -> None:
    """``doit build:hopper/qwen/w4`` and the like: the specs of exactly the targets doit
    selects, each equal to the whole tree's generation of it, no smoke task, cached under
    an entry of their own; the apple target's compiler is never run for them."""
    root, env = fake_project
    log = _logging_xcrun(tmp_path / "bin")
    whole = norm(resolve_build_specs(root, env))
    assert log.exists()  # the whole tree's generation probes it
    log.unlink()
    scopes = [
        ("build:hopper/qwen/w4",),
        ("build:gb10/*", "build:hopper/qwen/w8"),
        ("build:nosuch/m/q",),  # no target: named_failures fails it under doit
    ]
    for scope in scopes:
        want = [s for s in whole if in_scope(s[0], scope)]
        for expected in ("no cache file", "hit"):
            specs, smoke, how = _scoped(root, env, scope)
            assert (norm(specs), smoke, how) == (want, [], expected), scope
    assert not log.exists()
    state = root / STATE
    # The apple target's scope probes its toolchain (and its entry is its own).
    specs, _smoke, _how = _scoped(root, env, ("build:apple/llama/f16",))
    assert [s.target for s in specs] == ["apple/llama/f16"] and log.exists()
    # The whole tree is never answered by a scoped entry, however the hints read.
    assert taskcache.read_uses(state, _base(root, env)) is None
    assert lookup(root, env) == "no cache file"
    assert lookup(root, env) == "hit"


def test_a_scoped_entry_misses_when_its_compiler_changes(
    fake_project: tuple[Path, dict[str, str]], trusting: None, tmp_path: Path
) -> None:
    root, env = fake_project
    scope = ("build:hopper/*",)
    assert _scoped(root, env, scope)[2] == "no cache file"
    specs, _smoke, how = _scoped(root, env, scope)
    assert how == "hit"
    fake = tmp_path / "bin/fakecc"
    fake.write_text(fake.read_text() + "\n# rebuilt\n")
    again, _smoke, how = _scoped(root, env, scope)
    assert how == "no cache file"
    assert norm(again) == [s for s in norm(resolve_build_specs(root, env)) if "hopper" in s[0]]
    assert norm(again) != norm(specs)  # the identity in every plan changed


def test_doit_runs_of_some_targets_build_those_and_leave_the_rest_whole(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Under doit: a run naming targets builds exactly those without running another
    target's compiler, even to check; the default run still has every task."""
    root, env = fake_project
    log = _logging_xcrun(tmp_path / "bin")
    run = doit(root, ["build:hopper/qwen/w4", "build:gb10/qwen/*"], env)
    assert run.returncode == 0, run.text
    assert "3 built" in run.out and not log.exists(), run.text
    noop = doit(root, ["build:hopper/qwen/w4", "build:gb10/qwen/*"], env)
    assert noop.returncode == 0 and "3 up to date" in noop.out and not log.exists(), noop.text
    listing = doit(root, ["list", "--all"], env)
    assert listing.returncode == 0, listing.text
    assert {"build:apple/llama/f16", "build:hopper/qwen/w8", "smoke:hopper"} <= set(
        listing.out.split()
    )
    # The whole tree: the rest builds (the stand-in xcrun writes no output: that fails).
    rest = doit(root, ["build"], env)
    assert "1 built" in rest.out and "3 up to date" in rest.out and "1 failed" in rest.out, (
        rest.text
    )
    assert log.exists()
    # Each kind of run keeps its own plan of early dry runs: the whole tree's (xcrun's
    # among them) is not started by a run of the named targets, nor replaced by its plan.
    state = root / STATE
    whole = (state / earlyruns.PLAN_NAME).read_bytes()
    assert b"xcrun" in whole
    log.unlink()
    noop = doit(root, ["build:hopper/qwen/w4", "build:gb10/qwen/*"], env)
    assert noop.returncode == 0 and "3 up to date" in noop.out, noop.text
    assert not log.exists() and (state / earlyruns.PLAN_NAME).read_bytes() == whole


def test_a_dodo_with_a_task_of_its_own_is_never_scoped(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A task of the project's own may depend on any build sub-task, and doit checks every
    loaded task's dependencies: with one in the dodo file, a run naming targets still has
    every task (and runs only the named one)."""
    root, env = fake_project
    log = _logging_xcrun(tmp_path / "bin")
    (root / "dodo.py").write_text(
        "from metrale_orch.dodo import *  # noqa: F403\n\n\n"
        "def task_bundle():\n"
        '    return {"actions": None, "task_dep": ["build:hopper/qwen/w4", "build:gb10/qwen/w4"]}\n'
    )
    run = doit(root, ["build:hopper/qwen/w4"], env)
    assert run.returncode == 0 and "1 built" in run.out, run.text
    assert log.exists()  # the whole tree was generated: the apple target's xcrun ran
    both = doit(root, ["build:hopper/qwen/w4", "bundle"], env)
    assert both.returncode == 0 and "1 built" in both.out, both.text


def test_runs_of_many_scopes_never_evict_the_whole_tree_s_entry(
    fake_project: tuple[Path, dict[str, str]], trusting: None
) -> None:
    """Scoped entries and hints are kept apart from the whole tree's, KEEP of each: a loop
    over more targets than that (an editor's, a CI job's) leaves the whole tree a hit."""
    root, env = fake_project
    primed(root, env)
    for i in range(taskcache.KEEP + 2):
        assert _scoped(root, env, (f"build:hw{i}/*",))[2] == "no cache file"
    scoped = [p for p in entries(root) if p.name.startswith("build-tasks.scope-")]
    assert len(scoped) == taskcache.KEEP and len(entries(root)) == taskcache.KEEP + 1
    assert taskcache.read_uses(root / STATE, _base(root, env)) is not None
    assert lookup(root, env) == "hit"
    assert _scoped(root, env, (f"build:hw{taskcache.KEEP + 1}/*",))[2] == "hit"
    assert _scoped(root, env, ("build:hw0/*",))[2] == "no cache file"  # the oldest went
