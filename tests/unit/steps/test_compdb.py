"""The compilation database (``build/compile_commands.json``): what editors see.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/steps/test_compdb.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from metrale_orch.paths import compdb_part
from metrale_orch.steps.compdb import (
    CompileCommand,
    TargetCommands,
    encode_database,
    merge_commands,
    read_part,
    write_part,
)
from metrale_orch.tree import Target


def _command(file: str, directory: str = "stage/x") -> CompileCommand:
    return CompileCommand(
        file=file, directory=directory, arguments=("/bin/cc", "-I.", f"../{file}"), output="o"
    )


def _part(target: str, *files: str) -> TargetCommands:
    return TargetCommands(
        target=Target.parse(target), commands=tuple(_command(f, target) for f in files)
    )


def test_merge_takes_the_first_target_in_sorted_order_and_sorts_by_file() -> None:
    # Targets sort as (hw, model, quant): "b200" before "b200-x", though "-" < "/".
    parts = [
        _part("b200-x/m/q", "kernels/z.cu", "kernels/a.cu"),
        _part("b200/m/q", "kernels/a.cu"),
        _part("b200/m/p", "kernels/m.cu"),
    ]
    merged = merge_commands(parts)
    assert [(c.file, c.directory) for c in merged] == [
        ("kernels/a.cu", "b200/m/q"),
        ("kernels/m.cu", "b200/m/p"),
        ("kernels/z.cu", "b200-x/m/q"),
    ]
    assert merge_commands(reversed(parts)) == merged


def test_the_database_names_absolute_paths_and_keeps_relative_arguments() -> None:
    data = encode_database([_command("kernels/a.cu")], root="/src/proj", build="/real/build")
    assert json.loads(data) == [
        {
            "arguments": ["/bin/cc", "-I.", "../kernels/a.cu"],
            "directory": "/real/build/stage/x",
            "file": "/src/proj/kernels/a.cu",
            "output": "/real/build/o",
        }
    ]
    assert data.endswith(b"\n")


def test_a_part_round_trips_and_anything_else_reads_as_none(tmp_path: Path) -> None:
    part = _part("hopper/qwen/w4", "kernels/a.cu", "kernels/b.cu")
    write_part(tmp_path, part)
    assert read_part(tmp_path, part.target) == part
    path = compdb_part(tmp_path, "hopper", "qwen", "w4")
    assert path.is_file()
    other = Target.parse("hopper/qwen/w8")
    assert read_part(tmp_path, other) is None  # none written
    compdb_part(tmp_path, "hopper", "qwen", "w8").write_bytes(path.read_bytes())
    assert read_part(tmp_path, other) is None  # another target's
    for junk in (b"{", b"[]", b'{"schema": 0, "target": "hopper/qwen/w4", "commands": []}'):
        path.write_bytes(junk)
        assert read_part(tmp_path, part.target) is None
