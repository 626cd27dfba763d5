"""Planning many targets fast: ``PlanMemo`` and the string-based root-relative spellings.

The fast paths must give exactly what the plain definitions give: plans made
with one shared memo equal plans made one by one, and the root-relative
spellings equal ``paths.root_relative`` and ``tasks.dicts.rel_posix`` (doit's
``file_dep``).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metrale_orch.canonical import canonical_json, canonical_list, canonical_strings
from metrale_orch.errors import MetraleError
from metrale_orch.graph.specs import plan_build_spec, signature_parts
from metrale_orch.paths import root_relative
from metrale_orch.steps.plan import check_plan, plan_target
from metrale_orch.steps.plan_values import PlanMemo, RootRel
from metrale_orch.tasks.dicts import plan_build_task, rel_posix, task_dict
from metrale_orch.toolchain.definitions import load_toolchains
from metrale_orch.tree import Layout, resolve_all
from tests.support import REPO
from tests.support.project import make_project

#: Any text, lone surrogates included (a file name that is not UTF-8, as os.fsdecode keeps it).
_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)


@given(
    value=st.dictionaries(
        _TEXT,
        st.one_of(
            _TEXT,
            st.lists(_TEXT, max_size=4),
            st.tuples(_TEXT, _TEXT),
            st.lists(st.one_of(_TEXT, st.integers(), st.none()), max_size=3),
            st.integers(),
        ),
        max_size=5,
    )
)
def test_canonical_strings_is_canonical_json(value: dict[str, object]) -> None:
    """The module plans' fast encoding gives canonical_json's text, whatever the strings;
    values that are not strings fall back to it."""
    assert canonical_strings(value) == canonical_json(value)  # type: ignore[arg-type]
    nested = {**value, "~": {"x": "y"}}  # a mapping value is canonical_json's, not a list
    assert canonical_strings(nested) == canonical_json(nested)  # type: ignore[arg-type]


_SEGMENT = st.sampled_from(["a", "b", "kernels", "x-y", "a.b", "ab", "a b", "é"])


@given(
    root=st.lists(_SEGMENT, min_size=0, max_size=3),
    rest=st.lists(_SEGMENT, min_size=0, max_size=4),
    absolute=st.booleans(),
    inside=st.booleans(),
)
def test_root_rel_equals_the_slow_definitions(
    root: list[str], rest: list[str], absolute: bool, inside: bool
) -> None:
    base = PurePosixPath("/" if absolute else ".").joinpath(*root)
    root_path = Path(base)
    path = Path(base.joinpath(*rest)) if inside else Path("/elsewhere").joinpath(*rest)
    fast = RootRel(root_path)
    assert fast(path) == root_relative(path, root_path)
    assert fast.dep(path) == rel_posix(path, root_path)


@pytest.mark.parametrize(
    ("path", "root", "rel", "dep"),
    [
        ("/r/p/kernels/a.cu", "/r/p", "kernels/a.cu", "kernels/a.cu"),
        ("/r/px/a.cu", "/r/p", "/r/px/a.cu", "/r/px/a.cu"),
        ("/kernels/a.cu", "/", "kernels/a.cu", "kernels/a.cu"),
        ("p/kernels/a.cu", "p", "kernels/a.cu", "p/kernels/a.cu"),
    ],
)
def test_root_rel_examples(path: str, root: str, rel: str, dep: str) -> None:
    fast = RootRel(Path(root))
    assert (fast(Path(path)), fast.dep(Path(path))) == (rel, dep)


def _layouts(root: Path) -> list[Layout]:
    return [lay for _t, lay in resolve_all(root) if isinstance(lay, Layout)]


@pytest.mark.parametrize("tree", ["sample", "project"])
def test_memo_plans_equal_plain_plans(tree: str, tmp_path: Path) -> None:
    root = REPO if tree == "sample" else make_project(tmp_path / "proj")
    toolchains = load_toolchains(root)
    memo = PlanMemo(root)
    layouts = _layouts(root)
    planned = 0
    for layout in layouts:
        if layout.hardware.vendor not in ("nvidia", "cuda"):
            continue
        env = {"NVCC_PREPEND_FLAGS": "-G"}
        shared = plan_target(root, layout, toolchains, identity="id", environ=env, memo=memo)
        alone = plan_target(root, layout, toolchains, identity="id", environ=env)
        assert shared == alone
        assert dict(shared.signature) == dict(alone.signature)
        # The memoised encoding of the modules part is the part's own encoding.
        assert shared.signature_json["modules"] == canonical_json(shared.signature["modules"])
        assert signature_parts(shared.signature, shared.signature_json) == signature_parts(
            alone.signature
        )
        rels = [rel_posix(p, root) for p in shared.file_deps]
        assert rels == sorted(rels) and list(shared.file_dep_rels) == sorted(set(rels))
        assert set(shared.file_deps) == {
            *layout.inputs(),
            *layout.hardware_manifests,
            *layout.model_manifests,
            *([] if shared.toolchain.file is None else [shared.toolchain.file]),
        }
        planned += 1
    assert planned >= 4


def test_memo_hands_out_copies_of_shared_defaults(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    toolchains = load_toolchains(root)
    memo = PlanMemo(root)
    w4, w8 = [lay for lay in _layouts(root) if str(lay.target).startswith("hopper/")]
    a = plan_target(root, w4, toolchains, identity="id", memo=memo)
    b = plan_target(root, w8, toolchains, identity="id", memo=memo)
    assert a.signature["defaults"] == b.signature["defaults"]
    assert a.signature["defaults"] is not b.signature["defaults"]
    assert a.modules[0].argv is b.modules[0].argv  # add.cu: one argv for both targets


def test_the_task_of_a_plan_build_spec_is_plan_build_task_of_the_plan(tmp_path: Path) -> None:
    """Generation builds a task from the plan's finished parts (its doit spelling of the
    file deps, its pre-encoded signature parts): the same dict as from the plain parts."""
    root = REPO
    toolchains = load_toolchains(root)
    memo = PlanMemo(root)
    manifest = root / "build" / "m.json"
    for layout in _layouts(root):
        if layout.hardware.vendor not in ("nvidia", "cuda"):
            continue
        plan = plan_target(root, layout, toolchains, identity="id", memo=memo)
        name = str(layout.target)
        fast = task_dict(
            plan_build_spec(root=root, target=name, plan=plan, manifest=manifest), root
        )
        slow = plan_build_task(
            root=root,
            target=name,
            file_deps=plan.file_deps,
            signature=plan.signature,
            manifest=manifest,
        )
        assert fast.pop("uptodate")[0].parts == slow.pop("uptodate")[0].parts  # type: ignore[index]
        assert fast == slow


def test_memo_keeps_a_shared_module_apart_by_arch_and_flags(tmp_path: Path) -> None:
    """add.cu (hopper's common) is a module of every NVIDIA target: one memo must still
    plan it with each target's own arch (gb10 inherits it) and flags (w8's KERNEL.toml),
    in whatever order the targets come, and encode each plan's own signature entry."""
    root = make_project(tmp_path / "proj")
    (root / "kernels/hopper/qwen/w8/KERNEL.toml").write_text(
        '[build]\nextra_nvcc_flags = ["-DW8=1"]\n'
    )
    toolchains = load_toolchains(root)
    layouts = {str(lay.target): lay for lay in _layouts(root)}
    names = ["hopper/qwen/w4", "hopper/qwen/w8", "gb10/qwen/w4", "gb10/qwen/w8"]
    for order in (names, names[::-1]):
        memo = PlanMemo(root)
        argvs = {}
        for name in order:
            shared = plan_target(root, layouts[name], toolchains, identity="id", memo=memo)
            alone = plan_target(root, layouts[name], toolchains, identity="id")
            assert shared == alone
            assert shared.signature_json["modules"] == canonical_json(shared.signature["modules"])
            assert shared.signature_json["modules"] == canonical_list(
                canonical_json(entry) for entry in alone.signature["modules"]
            )
            argvs[name] = next(m.argv for m in shared.modules if m.stem == "add")
        assert len(set(argvs.values())) == 4
        assert all(("-DW8=1" in argv) == name.endswith("w8") for name, argv in argvs.items())


_BROKEN = {
    "no arch": ("kernels/hopper/HARDWARE.toml", '[hardware]\nvendor = "nvidia"\n', {}),
    "bad lever": (
        "kernels/hopper/HARDWARE.toml",
        '[hardware]\narch = "sm_90a"\n[defaults]\nno_such_lever = 1\n',
        {},
    ),
    "bad flag": (
        "kernels/hopper/qwen/w4/KERNEL.toml",
        "[build]\nextra_nvcc_flags = [3]\n",
        {},
    ),
    "clashing names": (
        "kernels/hopper/qwen/w4/KERNEL.toml",
        '[modules]\nscale = "add"\n',
        {},
    ),
    "bad switch": ("kernels/hopper/qwen/w4/.gitkeep", "", {"METRALE_KERNEL_NO_STRICT": "yes"}),
    "fine": ("kernels/hopper/qwen/w4/.gitkeep", "", {}),
}


@pytest.mark.parametrize("case", sorted(_BROKEN))
def test_check_plan_refuses_what_plan_target_refuses(case: str, tmp_path: Path) -> None:
    """``check`` asks check_plan, the build plan_target: the same error, or none."""
    relpath, text, env = _BROKEN[case]
    root = make_project(tmp_path / "proj")
    (root / relpath).write_text(text)
    toolchains = load_toolchains(root)
    layout = next(lay for lay in _layouts(root) if str(lay.target) == "hopper/qwen/w4")
    try:
        plan_target(root, layout, toolchains, identity="id", environ=env)
    except MetraleError as exc:
        with pytest.raises(type(exc)) as caught:
            check_plan(root, layout, toolchains, environ=env)
        assert str(caught.value) == str(exc)
    else:
        assert case == "fine"
        check_plan(root, layout, toolchains, environ=env)
