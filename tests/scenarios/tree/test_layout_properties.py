"""Laws of layout resolution (SPEC section 1), as hypothesis properties.

- resolution does not depend on directory listing order;
- every win in a returned Layout is declared, and every declaration covers a win
  (checked against an independent model of the merge rules of SPEC 1.5);
- adding a file under an unrelated directory changes no other target's layout;
- ``dump`` contains no absolute path.

Trees are built in a fresh temporary directory per example (hypothesis forbids
function-scoped fixtures such as ``tmp_path`` inside ``@given``).

They start no process, but build hundreds of trees (about 13 s of the unit tier's 71 s on
one core): they run with the scenarios, out of the one-minute inner loop.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from metrale_orch.tree import (
    DeadShadow,
    Layout,
    LayoutError,
    NoKernelDirectory,
    Role,
    Target,
    UndeclaredShadow,
    discover,
    dump,
    stem_of,
)
from tests.support.tree import hw, kernel_toml, model, write

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WIDE = settings(SETTINGS, max_examples=30)

POOL = ("a.cu", "b.cu", "a.cuh", "c.h", "d.cu", "e.txt", "a.b.cu")
STEMS = ("a", "b", "c", "d", "a.b")
LINKS = ("l1.cu", "l2.cuh", "zz.md", "aa")
USES = ("../u/common/a.cu", "../lib/x.cu", "common/b.cu", "../lib/y.cuh", "/abs.cu", "nope.cu")


@dataclass(frozen=True, slots=True, kw_only=True)
class DirSpec:
    files: frozenset[str]
    keys: frozenset[str] | None  # None: no KERNEL.toml
    uses: tuple[str, ...] = ()
    subdir: bool = False
    links: frozenset[str] = frozenset()


@st.composite
def dir_specs(draw: st.DrawFn, *, with_uses: bool) -> DirSpec | None:
    """A layer directory (None: absent); ``with_uses`` adds `use` strings and symlinks."""
    if not draw(st.booleans()):
        return None
    keys = draw(st.none() | st.frozensets(st.sampled_from(STEMS), max_size=3))
    uses: tuple[str, ...] = ()
    links: frozenset[str] = frozenset()
    if with_uses:
        if keys is not None:
            uses = tuple(draw(st.lists(st.sampled_from(USES), max_size=2, unique=True)))
        if draw(st.integers(0, 4)) == 0:
            links = draw(st.frozensets(st.sampled_from(LINKS), min_size=1))
    return DirSpec(
        files=draw(st.frozensets(st.sampled_from(POOL), max_size=5)),
        keys=keys,
        uses=uses,
        subdir=draw(st.booleans()),
        links=links,
    )


HWS = ("c", "p", "u")
LAYER_DIRS = tuple(f"kernels/{h}/{d}" for h in HWS for d in ("common", "m/q", "m/r"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeSpec:
    inherits: bool
    dirs: Mapping[str, DirSpec | None]


@st.composite
def tree_specs(draw: st.DrawFn, *, with_uses: bool = True) -> TreeSpec:
    return TreeSpec(
        inherits=draw(st.booleans()),
        dirs={d: draw(dir_specs(with_uses=with_uses)) for d in LAYER_DIRS},
    )


def build(root: Path, spec: TreeSpec) -> None:
    hw(root, "p")
    hw(root, "u")
    hw(root, "c", inherits="p" if spec.inherits else None)
    for h in HWS:
        model(root, h, "m")
    write(root, "kernels/lib/x.cu")
    write(root, "kernels/lib/y.cuh")
    write(root, "kernels/u/common/a.cu")
    for d, ds in spec.dirs.items():
        if ds is None:
            continue
        (root / d).mkdir(parents=True, exist_ok=True)
        for name in sorted(ds.files):
            write(root, f"{d}/{name}")
        for link in sorted(ds.links):
            os.symlink("nowhere" if link == "aa" else "../x", root / d / link)
        if ds.subdir:
            write(root, f"{d}/inc/deep/{d.replace('/', '_')}.h")
        if ds.keys is not None:
            kernel_toml(
                root,
                d,
                use=ds.uses or None,
                shadow={k: f"r {k}" for k in sorted(ds.keys)},
            )


@contextmanager
def tree(spec: TreeSpec) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        build(root, spec)
        yield root


def load_dump(root: Path) -> dict[str, Any]:
    got = dump(root)
    data = json.loads(got) if isinstance(got, str) else got
    assert isinstance(data, dict)
    return data


# --------------------------------------------------------------------------- listing order


class _ShuffledScandir:
    """An ``os.scandir`` iterator that yields its entries in a shuffled order."""

    def __init__(self, real: Any, rng: random.Random) -> None:
        self._real = real
        entries = list(real)
        rng.shuffle(entries)
        self._entries = iter(entries)

    def __iter__(self) -> _ShuffledScandir:
        return self

    def __next__(self) -> os.DirEntry[str]:
        return next(self._entries)

    def __enter__(self) -> _ShuffledScandir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._real.close()


@contextmanager
def shuffled_listings(seed: int) -> Iterator[list[int]]:
    """Patch os.scandir, os.listdir and Path.iterdir to list in a seeded random order."""
    rng = random.Random(seed)
    calls = [0]
    real_scandir = os.scandir
    real_listdir = os.listdir
    real_iterdir = Path.iterdir

    def scandir(path: Any = ".") -> _ShuffledScandir:
        calls[0] += 1
        return _ShuffledScandir(real_scandir(path), rng)

    def listdir(path: Any = ".") -> list[str]:
        calls[0] += 1
        names = real_listdir(path)
        rng.shuffle(names)
        return names

    def iterdir(self: Path) -> Iterator[Path]:
        calls[0] += 1
        children = list(real_iterdir(self))
        rng.shuffle(children)
        return iter(children)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "scandir", scandir)
        mp.setattr(os, "listdir", listdir)
        mp.setattr(Path, "iterdir", iterdir)
        yield calls


@WIDE
@given(spec=tree_specs(), seeds=st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=2))
def test_resolution_does_not_depend_on_listing_order(spec: TreeSpec, seeds: list[int]) -> None:
    with tree(spec) as root:
        baseline = load_dump(root)
        for seed in seeds:
            with shuffled_listings(seed) as calls:
                shuffled = load_dump(root)
            assert calls[0] > 0, "the listing patches were never called"
            assert json.dumps(shuffled) == json.dumps(baseline)


def test_shuffled_listings_really_shuffle(tmp_path: Path) -> None:
    for i in range(12):
        write(tmp_path, f"d/f{i:02}")
    plain = [e.name for e in os.scandir(tmp_path / "d")]
    with shuffled_listings(1):
        with os.scandir(tmp_path / "d") as it:
            got = [e.name for e in it]
        listed = os.listdir(tmp_path / "d")
        iterated = [p.name for p in (tmp_path / "d").iterdir()]
    assert sorted(got) == sorted(plain) == sorted(listed) == sorted(iterated)
    assert got != sorted(got) or listed != sorted(listed)


# --------------------------------------------------------------------------- declared wins

FOUR = ("kernels/c/m/q", "kernels/p/m/q", "kernels/c/common", "kernels/p/common")
ROLES = (Role.LEAF, Role.LEAF, Role.COMMON, Role.COMMON)


def _ext(name: str) -> str:
    return name.rsplit(".", 1)[1] if "." in name else ""


def _layers_of(spec: TreeSpec) -> list[tuple[str, Role]]:
    return [(d, r) for d, r in zip(FOUR, ROLES, strict=True) if spec.inherits or "/p/" not in d]


def wins_of(spec: TreeSpec) -> set[tuple[Any, ...]]:
    """Wins of target c/m/q by SPEC 1.5: (role, name, winner, loser, winner's layer index)."""
    maps: dict[Role, dict[str, tuple[int, str]]] = {Role.LEAF: {}, Role.COMMON: {}}
    wins: set[tuple[Any, ...]] = set()
    for index, (d, role) in enumerate(_layers_of(spec)):
        ds = spec.dirs[d]
        if ds is None:
            continue
        for name in sorted(n for n in ds.files if _ext(n) in ("cu", "cuh", "h")):
            path = f"{d}/{name}"
            if name in maps[role]:
                w_index, w_path = maps[role][name]
                wins.add((role, name, w_path, path, w_index))
            else:
                maps[role][name] = (index, path)
    for name, (index, path) in maps[Role.LEAF].items():
        for cname, (_, cpath) in maps[Role.COMMON].items():
            if _ext(name) == _ext(cname) == "cu" and stem_of(name) == stem_of(cname):
                wins.add((Role.LEAF, name, path, cpath, index))
    return wins


@st.composite
def win_specs(draw: st.DrawFn) -> TreeSpec:
    dirs: dict[str, DirSpec | None] = {d: None for d in LAYER_DIRS}
    for d in FOUR:
        dirs[d] = draw(dir_specs(with_uses=False))
    spec = TreeSpec(inherits=draw(st.booleans()), dirs=dirs)
    mode = draw(st.sampled_from(["as drawn", "exact", "one dead key"]))
    if mode != "as drawn":
        # declare exactly the wins, so that resolving trees with wins are common
        wins = wins_of(spec)
        existing = [(i, d) for i, (d, _) in enumerate(_layers_of(spec)) if dirs[d] is not None]
        dead_at = draw(st.sampled_from(existing))[0] if mode != "exact" and existing else None
        for index, d in existing:
            ds = dirs[d]
            assert ds is not None
            needed = frozenset(stem_of(w[1]) for w in wins if w[4] == index)
            if index == dead_at:
                needed |= {draw(st.sampled_from([x for x in STEMS if x not in needed]))}
            keys = needed if needed or ds.keys is not None else None
            dirs[d] = DirSpec(files=ds.files, keys=keys, subdir=ds.subdir)
    return spec


def oracle(spec: TreeSpec) -> tuple[type[LayoutError] | None, set[tuple[Any, ...]]]:
    """The wins of target c/m/q and the error they must produce (None: it resolves)."""
    layers = _layers_of(spec)
    if not any(spec.dirs[d] is not None for d, _ in layers):
        return NoKernelDirectory, set()
    wins = wins_of(spec)
    declared: dict[int, frozenset[str]] = {}
    for i, (d, _) in enumerate(layers):
        ds = spec.dirs[d]
        declared[i] = (ds.keys or frozenset()) if ds is not None else frozenset()
    needed: dict[int, set[str]] = {i: set() for i in declared}
    for win in wins:
        needed[win[4]].add(stem_of(win[1]))
    if any(not needed[i] <= declared[i] for i in declared):
        return UndeclaredShadow, wins
    if any(not declared[i] <= needed[i] for i in declared):
        return DeadShadow, wins
    return None, wins


def check_declared(lay: Layout) -> None:
    """Every Shadow is declared by its winner's layer; every key of every layer covers one."""
    covered: dict[int, set[str]] = {i: set() for i in range(len(lay.layers))}
    for shadow in lay.shadows:
        entries = lay.leaf if shadow.role == Role.LEAF else lay.common
        winner = entries[shadow.name]
        assert winner.source == shadow.winner
        manifest = lay.layers[winner.layer].manifest
        assert manifest is not None
        stem = stem_of(shadow.name)
        assert manifest.shadow[stem] == shadow.reason
        covered[winner.layer].add(stem)
    for i, layer in enumerate(lay.layers):
        keys = set(layer.manifest.shadow) if layer.manifest is not None else set()
        assert keys == covered[i], (layer.dir, keys, covered[i])


@SETTINGS
@given(spec=win_specs())
def test_every_win_declared_and_every_declaration_covers_a_win(spec: TreeSpec) -> None:
    error, wins = oracle(spec)
    event(f"outcome: {error.__name__ if error else 'resolves'}; wins: {min(len(wins), 3)}")
    with tree(spec) as root:
        target = Target(hardware="c", model="m", quant="q")
        if error is not None:
            with pytest.raises(error):
                discover(root, target)
            return
        lay = discover(root, target)
        check_declared(lay)
        got = {
            (s.role, s.name, s.winner.relative_to(root).as_posix(), s.loser.relative_to(root))
            for s in lay.shadows
        }
        assert len(got) == len(lay.shadows) == len(wins)
        assert got == {(r, n, w, Path(lo)) for r, n, w, lo, _ in wins}
        assert all(s.reason == f"r {stem_of(s.name)}" for s in lay.shadows)
        shadows = list(lay.shadows)
        order = [(s.role != Role.LEAF, s.name, s.loser) for s in shadows]
        assert order == sorted(order)


# --------------------------------------------------------------------------- unrelated files

EXTRA_DIRS = (
    *LAYER_DIRS,
    "kernels/c/m/newq",
    "kernels/c/other",
    "kernels/lib",
    "kernels/c/m/q/inc",
    "kernels/p/common/inc",
    "kernels/u",
)


def related_dirs(target: str, inherits: bool) -> set[str]:
    h, m, q = target.split("/")
    dirs = {f"kernels/{h}/{m}/{q}", f"kernels/{h}/common"}
    if h == "c" and inherits:
        dirs |= {f"kernels/p/{m}/{q}", "kernels/p/common"}
    return dirs


@WIDE
@given(
    spec=tree_specs(with_uses=False),
    where=st.sampled_from(EXTRA_DIRS),
    name=st.sampled_from(POOL),
)
def test_adding_an_unrelated_file_changes_no_other_target(
    spec: TreeSpec, where: str, name: str
) -> None:
    with tree(spec) as root:
        before = load_dump(root)
        write(root, f"{where}/{name}", "// added\n")
        after = load_dump(root)
    for target, value in before.items():
        related = related_dirs(target, spec.inherits)
        if any(where == d or where.startswith(d + "/") for d in related):
            continue
        assert after[target] == value, (target, where, name)


# --------------------------------------------------------------------------- dump vs discover


def as_dump(lay: Layout, root: Path) -> dict[str, Any]:
    """SPEC 1.7's JSON view of one Layout, built here from the Layout's attributes."""

    def r(path: Path) -> str:
        return path.relative_to(root).as_posix()

    def entries(m: Mapping[str, Any]) -> dict[str, Any]:
        return {n: [r(e.source), e.layer, e.used] for n, e in m.items()}

    return {
        "common": entries(lay.common),
        "common_subdirs": {n: r(p) for n, p in lay.common_subdirs.items()},
        "configs": [r(p) for p in lay.configs()],
        "layers": [[x.role.value, x.tier.value, r(x.dir)] for x in lay.layers],
        "leaf": entries(lay.leaf),
        "leaf_subdirs": {n: r(p) for n, p in lay.leaf_subdirs.items()},
        "modules": {s: r(e.source) for s, e in lay.modules()},
        "shadows": [[s.role.value, s.name, r(s.winner), r(s.loser), s.reason] for s in lay.shadows],
        "source_model": lay.source_model,
    }


@WIDE
@given(spec=tree_specs())
def test_dump_agrees_with_independent_discover(spec: TreeSpec) -> None:
    # dump resolves every target in one pass; each must equal a fresh, separate discover
    with tree(spec) as root:
        data = load_dump(root)
        for key, value in data.items():
            target = Target.parse(key)
            if set(value) == {"error"}:
                with pytest.raises(LayoutError) as ei:
                    discover(root, target)
                assert str(ei.value) == value["error"]
            else:
                assert as_dump(discover(root, target), root) == value


# --------------------------------------------------------------------------- no absolute path


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


@WIDE
@given(spec=tree_specs())
def test_dump_contains_no_absolute_path(spec: TreeSpec) -> None:
    with tree(spec) as root:
        data = load_dump(root)
        text = json.dumps(data)
        for form in {str(root), str(root.resolve()), str(root.parent)}:
            assert form not in text
        for key, value in data.items():
            if set(value) == {"error"}:
                continue  # a message may quote a user's own absolute `use` string
            for s in _strings(value):
                assert not s.startswith("/"), (key, s)
                assert "\\" not in s, (key, s)
