"""The kept code of the package's dataclass methods (:mod:`metrale_orch.dataclass_code`).

A class made with the kept code must be the class made without it, method for method,
and the keeping must still apply on the interpreter the suite runs on: the module rests
on one detail of :mod:`dataclasses` (it compiles the methods it generates through the
built-in ``exec``), and these tests fail loudly where a Python upgrade changes that.
"""

from __future__ import annotations

import marshal
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import CodeType

from metrale_orch import dataclass_code
from metrale_orch.dataclass_code import CodeCache, cache_file
from metrale_orch.paths import user_cache_home

#: Imports every module of the package (but the doit entry module, whose import starts
#: the probes, and ``__main__``), with the kept code installed or not, and prints the code
#: of every method dataclasses generated for the package's classes, marshalled.
_DUMP = r"""
import dataclasses, importlib, marshal, pkgutil, sys
from pathlib import Path

mode, home = sys.argv[1], Path(sys.argv[2])
cache = None
if mode == "on":
    from metrale_orch.dataclass_code import install

    cache = install(home)
    assert cache is not None
import metrale_orch

names = [m.name for m in pkgutil.walk_packages(metrale_orch.__path__, "metrale_orch.")]
code = {}
for name in sorted(names):
    if name in ("metrale_orch.dodo", "metrale_orch.__main__"):
        continue
    module = importlib.import_module(name)
    for attr, value in sorted(vars(module).items()):
        if not (isinstance(value, type) and value.__module__ == name):
            continue
        if not dataclasses.is_dataclass(value):
            continue
        for method in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"):
            func = value.__dict__.get(method)
            func = getattr(func, "__wrapped__", func)  # __repr__ guards against recursion
            got = getattr(func, "__code__", None)
            if got is not None and got.co_filename == "<string>":
                code[f"{name}.{attr}.{method}"] = got
before = cache.compiled if cache is not None else 0


@dataclasses.dataclass(frozen=True)
class NotOurs:  # another module's class: compiled as ever, never kept
    x: int
    y: "list[int]" = dataclasses.field(default_factory=list)


import typing

counts = (cache.hits, cache.compiled) if cache is not None else (0, 0)
assert counts[1] == before, "a class of __main__ was kept"
other = {"code": NotOurs.__init__.__code__, "hints": repr(typing.get_type_hints(NotOurs.__init__))}
sys.stdout.buffer.write(
    marshal.dumps({"code": code, "other": other, "hits": counts[0], "compiled": counts[1]})
)
"""


def _head() -> bytes:
    """The first bytes of a file this interpreter reads."""
    return dataclass_code._MAGIC + dataclass_code._tag()


def _dump(mode: str, home: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", _DUMP, mode, str(home)], capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    got = marshal.loads(proc.stdout)
    assert isinstance(got, dict)
    return got


def test_kept_code_makes_every_class_as_python_does(tmp_path: Path) -> None:
    """Cold (compiled and written) and warm (read back), every generated method of every
    dataclass of the package has the code Python compiles without the keeping; and on the
    warm run nothing is compiled: the keeping applies on this interpreter."""
    plain = _dump("off", tmp_path)
    cold = _dump("on", tmp_path)
    assert cache_file(tmp_path).is_file()
    warm = _dump("on", tmp_path)
    code = plain["code"]
    assert isinstance(code, dict)
    assert len(code) > 100  # the package's value and error classes, each several methods
    assert cold["code"] == code
    assert warm["code"] == code
    # Another module's class is made as without the keeping (annotations evaluated, too).
    assert cold["other"] == warm["other"] == plain["other"]
    assert isinstance(cold["compiled"], int) and cold["compiled"] >= len(set(code.values()))
    assert warm["compiled"] == 0, "the kept code was not used: see metrale_orch/dataclass_code"
    assert isinstance(warm["hits"], int) and warm["hits"] >= len(code)


def test_a_damaged_or_foreign_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "code.marshal"
    source = "def __create_fn__():\n def f(x):\n  return x + 1\n return f"
    for damage in (b"", b"garbage", dataclass_code._MAGIC + b"\x00\x01\x02"):
        path.write_bytes(damage)
        cache = CodeCache(path)
        got = cache.code(source)
        assert isinstance(got, CodeType) and cache.compiled == 1
        cache.save()
        again = CodeCache(path)
        assert again.code(source) == got
        assert (again.hits, again.compiled) == (1, 0)
    # A damaged entry in a sound file is compiled again.
    path.write_bytes(path.read_bytes()[: len(_head())] + marshal.dumps({source: b"\x00junk"}))
    damaged = CodeCache(path)
    assert damaged.code(source) == got
    assert (damaged.hits, damaged.compiled) == (0, 1)
    damaged.save()
    # Another interpreter's file (another bytecode magic) is not read.
    data = path.read_bytes()
    header = len(dataclass_code._MAGIC)
    path.write_bytes(data[:header] + b"\x00\x00\r\n" + data[header + 4 :])
    other = CodeCache(path)
    assert other.code(source) == got
    assert (other.hits, other.compiled) == (0, 1)


def test_a_file_others_may_write_is_not_read(tmp_path: Path) -> None:
    """Its code would run in this process: a file group or others may write is ignored."""
    path = tmp_path / "code.marshal"
    source = "def __create_fn__():\n def f():\n  return 1\n return f"
    first = CodeCache(path)
    first.code(source)
    first.save()
    for mode, read in ((0o644, True), (0o664, False), (0o646, False), (0o600, True)):
        path.chmod(mode)
        cache = CodeCache(path)
        cache.code(source)
        assert (cache.hits, cache.compiled) == ((1, 0) if read else (0, 1)), oct(mode)


def test_code_is_compiled_as_exec_compiles_a_string(tmp_path: Path) -> None:
    """No future flag of the module doing the compile reaches the code: a generated
    method's annotations are evaluated, as when dataclasses runs ``exec`` itself."""
    source = "def __create_fn__(T):\n def f(x: T) -> T:\n  return x\n return f"
    namespace: dict[str, object] = {}
    exec(CodeCache(tmp_path / "c").code(source), {}, namespace)
    make = namespace["__create_fn__"]
    assert callable(make)
    assert make(int).__annotations__ == {"x": int, "return": int}


def test_the_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """Written under a umask that lets the group write (many distributions' default for
    users), the file is still read back: it is written 0600."""
    path = tmp_path / "sub" / "code.marshal"
    source = "def __create_fn__():\n def f():\n  return 2\n return f"
    old = os.umask(0o002)
    try:
        first = CodeCache(path)
        first.code(source)
        first.save()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = CodeCache(path)
    again.code(source)
    assert (again.hits, again.compiled) == (1, 0)
    assert [p.name for p in path.parent.iterdir()] == ["code.marshal"]  # no temporary left


def test_each_optimisation_level_has_its_file(tmp_path: Path) -> None:
    """Runs with and without ``-O`` keep different code: neither replaces the other's file."""
    show = "import sys; from pathlib import Path; from metrale_orch.dataclass_code import "
    show += "cache_file; print(cache_file(Path(sys.argv[1])).name)"
    names = [
        subprocess.run(
            [sys.executable, *flags, "-c", show, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for flags in ([], ["-O"], ["-OO"])
    ]
    assert len(set(names)) == 3, names
    assert cache_file(tmp_path) == tmp_path / "metrale-orch-code" / names[0]


def test_a_relative_xdg_cache_home_is_ignored() -> None:
    """As the XDG specification says: it would name a directory under wherever a run starts."""
    assert user_cache_home({"XDG_CACHE_HOME": "rel/cache", "HOME": "/home/u"}) == Path(
        "/home/u/.cache"
    )
    assert user_cache_home({"XDG_CACHE_HOME": "/xdg"}) == Path("/xdg")
    assert user_cache_home({"XDG_CACHE_HOME": "rel"}) is None
