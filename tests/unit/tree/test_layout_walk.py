"""Conformance tests for SPEC section 1: ``walk``, ``symlinks()`` and ``dump`` (the rest of section
1 is in the other ``tests/unit/tree/test_layout_*.py``).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from metrale_orch.tree import (
    Entry,
    InheritsError,
    Layer,
    LayoutError,
    ManifestError,
    RetiredKey,
    Role,
    Target,
    Tier,
    UnknownVendor,
    dump,
    symlinks,
    walk,
)
from metrale_orch.tree.files import child_maker
from tests.support.tree import files, full_tree, hw, model, plain, symlink, write

# --------------------------------------------------------------------------- walk


def test_walk(tmp_path: Path) -> None:
    hw(tmp_path, "b")
    hw(tmp_path, "a", inherits="p")
    hw(tmp_path, "p")
    write(tmp_path, "kernels/nohw/m/MODEL.toml", "")  # no HARDWARE.toml: not hardware
    files(tmp_path, "kernels/nohw/m/q/x.cu", "kernels/README.md")
    model(tmp_path, "a", "m")
    model(tmp_path, "a", "z")
    model(tmp_path, "a", "alias", kernel_source="base")
    model(tmp_path, "a", "base")
    model(tmp_path, "p", "m")
    model(tmp_path, "p", "base", kernel_source="pb")
    model(tmp_path, "p", "pb")
    files(
        tmp_path,
        "kernels/a/m/q2/x.cu",
        "kernels/a/m/q1/x.cu",
        "kernels/a/m/notes.md",
        "kernels/a/nomodel/q/x.cu",
        "kernels/a/common/x.cu",
        "kernels/a/base/bq/x.cu",
        "kernels/a/alias/own/x.cu",  # not the source model's dir
        "kernels/p/m/q1/y.cu",
        "kernels/p/m/q3/y.cu",
        "kernels/p/pb/pq/y.cu",
        "kernels/p/base/ignored/y.cu",
    )
    (tmp_path / "kernels/a/z/empty").mkdir(parents=True)
    write(tmp_path, "kernels/b/m/MODEL.toml", "")
    targets = walk(tmp_path)
    assert [str(t) for t in targets] == [
        "a/alias/bq",
        "a/alias/pq",
        "a/base/bq",
        "a/base/pq",
        "a/m/q1",
        "a/m/q2",
        "a/m/q3",
        "a/z/empty",
        "p/base/pq",
        "p/m/q1",
        "p/m/q3",
        "p/pb/pq",
    ]
    assert all(isinstance(t, Target) for t in targets)
    assert targets == sorted(targets)


def test_walk_model_toml_must_be_a_file(tmp_path: Path) -> None:
    hw(tmp_path, "h")
    (tmp_path / "kernels/h/m/MODEL.toml").mkdir(parents=True)
    (tmp_path / "kernels/h/m/q").mkdir()
    assert walk(tmp_path) == []


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("[hardware\n", ManifestError),
        ('[hardware]\nvendor = "intel"\n', UnknownVendor),
        ('[hardware]\ninherits = "nope"\n', InheritsError),
        ("[kernels]\noverrides = 1\n", RetiredKey),
    ],
)
def test_walk_hardware_errors_abort(tmp_path: Path, raw: str, error: type[LayoutError]) -> None:
    plain(tmp_path, "a")
    files(tmp_path, "kernels/a/m/q/x.cu")
    hw(tmp_path, "z", raw=raw)
    with pytest.raises(error):
        walk(tmp_path)
    with pytest.raises(error):
        dump(tmp_path)


# --------------------------------------------------------------------------- symlinks()


def test_symlinks(tmp_path: Path) -> None:
    files(tmp_path, "kernels/h/common/x.cu", "kernels/h/real/inner.cu", "outside/o.cu")
    symlink(tmp_path, "outside/innerlink.cu", "o.cu")
    a = symlink(tmp_path, "kernels/h/common/y.cu", "x.cu")
    b = symlink(tmp_path, "kernels/h/dangling", "nowhere")
    c = symlink(tmp_path, "kernels/h/linkdir", "real")
    d = symlink(tmp_path, "kernels/h/out", "../../outside")
    e = symlink(tmp_path, "kernels/h/real/deep.cuh", "inner.cu")
    symlink(tmp_path, "notkernels.cu", "outside/o.cu")
    got = symlinks(tmp_path)
    assert list(got) == sorted([a, b, c, d, e])
    assert list(got) == sorted(got)


def test_symlinks_none(tmp_path: Path) -> None:
    files(tmp_path, "kernels/h/common/x.cu")
    assert list(symlinks(tmp_path)) == []


# --------------------------------------------------------------------------- dump


def test_dump(tmp_path: Path) -> None:
    full_tree(tmp_path)
    files(tmp_path, "kernels/c/other/q/x.cu")
    model(tmp_path, "c", "other", supported_quants=["nope"])
    got = dump(tmp_path)
    data = json.loads(got) if isinstance(got, str) else got
    text = json.dumps(data)
    assert str(tmp_path) not in text
    assert list(data) == sorted(data)
    assert list(data) == ["c/m/q", "c/other/q", "c/s/q", "p/s/q"]
    assert set(data["c/other/q"]) == {"error"}
    assert "not supported" in data["c/other/q"]["error"]
    assert "kernels/c/other/MODEL.toml" in data["c/other/q"]["error"]
    assert data["c/m/q"] == {
        "common": {
            "c.h": ["kernels/c/common/c.h", 2, False],
            "k1.cu": ["kernels/c/common/k1.cu", 2, False],
            "k4.cu": ["kernels/c/common/k4.cu", 2, False],
            "k5.cu": ["kernels/p/common/k5.cu", 3, False],
            "used.cu": ["kernels/lib/used.cu", 2, True],
        },
        "common_subdirs": {"pinc": "kernels/p/common/pinc"},
        "configs": [
            "kernels/p/common/KERNEL.toml",
            "kernels/c/common/KERNEL.toml",
            "kernels/c/s/q/KERNEL.toml",
        ],
        "layers": [
            ["leaf", "own", "kernels/c/s/q"],
            ["leaf", "parent", "kernels/p/s/q"],
            ["common", "own", "kernels/c/common"],
            ["common", "parent", "kernels/p/common"],
        ],
        "leaf": {
            "h1.cuh": ["kernels/c/s/q/h1.cuh", 0, False],
            "k1.cu": ["kernels/c/s/q/k1.cu", 0, False],
            "k2.cu": ["kernels/p/s/q/k2.cu", 1, False],
            "k3.cu": ["kernels/c/s/q/k3.cu", 0, False],
        },
        "leaf_subdirs": {"inc": "kernels/c/s/q/inc"},
        "modules": {
            "k1": "kernels/c/s/q/k1.cu",
            "k2": "kernels/p/s/q/k2.cu",
            "k3": "kernels/c/s/q/k3.cu",
            "k4": "kernels/c/common/k4.cu",
            "k5": "kernels/p/common/k5.cu",
            "used": "kernels/lib/used.cu",
        },
        "shadows": [
            ["leaf", "k1.cu", "kernels/c/s/q/k1.cu", "kernels/c/common/k1.cu", "r1"],
            ["leaf", "k3.cu", "kernels/c/s/q/k3.cu", "kernels/p/s/q/k3.cu", "r3"],
            ["common", "k4.cu", "kernels/c/common/k4.cu", "kernels/p/common/k4.cu", "r4"],
        ],
        "source_model": "s",
    }
    for value in data.values():
        assert list(value) == sorted(value)


def test_dump_relative_root_matches_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_tree(tmp_path)
    absolute = dump(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert dump(Path(".")) == absolute
    assert dump(".") == absolute


def test_dump_error_entries_name_files_relative(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu", "kernels/h/common/x.cu")
    got = dump(tmp_path)
    data = json.loads(got) if isinstance(got, str) else got
    assert set(data) == {"h/m/q"}
    message = data["h/m/q"]["error"]
    assert '[shadow] x = "<reason>"' in message
    assert "kernels/h/m/q/KERNEL.toml" in message
    assert str(tmp_path) not in message


def test_dump_empty_tree(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    got = dump(tmp_path)
    assert (json.loads(got) if isinstance(got, str) else got) == {}


def test_child_maker_matches_joinpath() -> None:
    # The one private pathlib method the tree uses (files.child_maker): same result as `/`.

    for parent in (Path("/a/b"), Path("rel"), Path(".")):
        child = child_maker(parent)("c.cu")
        assert type(child) is type(parent / "c.cu")
        assert child == parent / "c.cu" and str(child) == str(parent / "c.cu")


def test_entry_and_layer_values_compare_hash_and_pickle() -> None:

    entry = Entry(name="a.cu", source=Path("/k/a.cu"), layer=0, used=False)
    twin = pickle.loads(pickle.dumps(entry))
    assert twin == entry and hash(twin) == hash(entry)
    assert repr(entry) == "Entry(name='a.cu', source=PosixPath('/k/a.cu'), layer=0, used=False)"
    layer = Layer(role=Role.LEAF, tier=Tier.OWN, hardware="h", dir=Path("/k"), manifest=None)
    assert pickle.loads(pickle.dumps(layer)) == layer
    assert hash(layer) == hash(Layer(**{f: getattr(layer, f) for f in layer.__slots__}))
