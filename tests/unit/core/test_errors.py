"""The package's error base: fields, templates, and what every error keeps."""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import pkgutil
import string
from pathlib import Path

import metrale_orch
from metrale_orch.errors import MetraleError, UsageError
from metrale_orch.tree.errors import LayoutError, UseError


def _all_errors() -> list[type[MetraleError]]:
    for info in pkgutil.walk_packages(metrale_orch.__path__, "metrale_orch."):
        if not info.name.endswith(".__main__"):  # runs the CLI
            importlib.import_module(info.name)
    found: list[type[MetraleError]] = []
    todo: list[type[MetraleError]] = [MetraleError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_template_names_attributes_of_its_error() -> None:
    # mypy cannot see into a template: a misspelt name would only fail when raised.
    checked = 0
    for cls in _all_errors():
        if not cls.template:
            continue
        assert dataclasses.is_dataclass(cls), cls
        names = {f.name for f in dataclasses.fields(cls)}
        for _, field, _, _ in string.Formatter().parse(cls.template):
            if field is not None:
                root = field.split(".")[0].split("[")[0]
                assert root in names or isinstance(getattr(cls, root, None), property), (
                    cls,
                    field,
                )
        checked += 1
    assert checked > 10


def test_a_case_with_fields_is_a_dataclass_of_them() -> None:
    exc = UseError(Path("/r/kernels/h/KERNEL.toml"), "kernels/h/KERNEL.toml", "x.cu", "absent")
    assert str(exc) == "kernels/h/KERNEL.toml: [sources] use 'x.cu': absent"
    assert (exc.use, exc.problem) == ("x.cu", "absent")
    assert exc != UseError(exc.manifest, exc.rel, exc.use, exc.problem)  # identity, hashable
    assert {exc} == {exc}
    twin = pickle.loads(pickle.dumps(exc))
    assert type(twin) is UseError and str(twin) == str(exc)
    exc.add_note("notes need a mutable error")


def test_a_case_without_fields_keeps_the_message_constructor() -> None:
    assert str(UsageError("no such command")) == "no such command"
    assert str(LayoutError("kernels/: unreadable")) == "kernels/: unreadable"
    assert not dataclasses.is_dataclass(LayoutError)
