"""The kept times files decide no byte (issue 43, B2, B5, B6): a poisoned one is ignored.

``target-times.json`` and ``compile-times.json`` under ``<build_dir>/.state`` only order
the compiles and balance the CI rows. Whatever they hold (NaN, infinite, negative or
huge seconds, JSON nested past the parser's depth, a FIFO in their place) a build builds
and says so in one warning line naming the file, and ``matrix`` prints valid JSON with
no empty build row.

The tests of this topic that start processes are in
``tests/scenarios/steps/test_kept_files_hardening.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from metrale_orch.matrix.balance import plan_lpt
from metrale_orch.steps.times import TARGET_TIMES, TIMES, read_target_seconds, read_times
from tests.support.matrix import _write, cli, sample_tree
from tests.support.steps import POISON, STATE


@pytest.mark.parametrize("kind", sorted(POISON))
@pytest.mark.parametrize("shards", ["2", "3"])
def test_matrix_with_poisoned_times_prints_valid_json_and_no_empty_build(
    tmp_path: Path, kind: str, shards: str
) -> None:
    tree = sample_tree(tmp_path)
    _write(tree / STATE / TARGET_TIMES, POISON[kind])
    code, out, err = cli(tree, "hopper", "--shards", shards)
    assert code == 0, err
    assert "Traceback" not in err and "internal error" not in err
    assert err.count("\n") == 1 and err.startswith("warning: ") and TARGET_TIMES in err
    rows = json.loads(out, parse_constant=pytest.fail)["include"]  # NaN/Infinity refused
    assert rows and all(row["build"].startswith("build:hopper/") for row in rows)
    assert sorted(t for row in rows for t in row["targets"]) == [
        "hopper/llama/bf16",
        "hopper/qwen3/bf16",
        "hopper/qwen3/nvfp4",
    ]


def test_lpt_never_makes_an_empty_row() -> None:
    # Negative costs (from any caller) once left a row empty: its build was "".
    assert all(plan_lpt({"a": -5.0, "b": -1.0, "c": 1.0}, 3))


@pytest.mark.parametrize("name", [TIMES, TARGET_TIMES])
def test_a_fifo_or_deep_json_in_place_of_a_times_file_reads_as_nothing(
    tmp_path: Path, name: str
) -> None:
    os.mkfifo(tmp_path / name)  # reading it would wait for a writer forever
    assert read_times(tmp_path).modules == {} and read_target_seconds(tmp_path) == {}
    os.unlink(tmp_path / name)
    (tmp_path / name).write_text('{"schema": 1, "modules": ' + "[" * 100_000 + "}")
    assert read_times(tmp_path).modules == {} and read_target_seconds(tmp_path) == {}
