"""The wheel carries every sub-package and the built-in toolchain files."""

from __future__ import annotations

import tomllib

from setuptools import find_packages

from tests.support import REPO


def test_package_discovery_covers_every_subpackage() -> None:
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(find_packages(str(REPO), include=conf["packages"]["find"]["include"]))
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "metrale_orch").rglob("__init__.py")
    }
    assert on_disk <= found, on_disk - found


def test_builtin_toolchains_are_package_data() -> None:
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = conf["package-data"]["metrale_orch"]
    shipped = {p for pat in patterns for p in (REPO / "metrale_orch").glob(pat)}
    assert {p.name for p in shipped if p.suffix == ".toml"} >= {
        "nvcc.toml",
        "metal.toml",
        "hip.toml",
    }
