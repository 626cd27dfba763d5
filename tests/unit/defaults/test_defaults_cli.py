"""Tests for metrale_orch.defaults (SPEC 2): the docs' table, ``metrale-orch defaults``, and what
the build reads (the rest is in the other ``tests/unit/defaults/test_defaults_*.py``; the
tests that start processes are in ``tests/scenarios/defaults/test_defaults.py``).
"""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path
from typing import Any

import pytest

from metrale_orch import defaults as D
from metrale_orch.cli import main
from metrale_orch.defaults import (
    LEVERS,
    DeclaredLevers,
    LeverDeclarationError,
    TreeDefaults,
    baseline,
    format_levers,
    render_docs,
    resolve,
    resolved,
    write_docs,
)
from metrale_orch.steps.plan import plan_target
from metrale_orch.toolchain.definitions import builtin_toolchains
from metrale_orch.tree import Target, discover
from tests.support import REPO
from tests.support.build import small_tree
from tests.support.defaults import (
    GEMV_BANDS,
    GEMV_BASELINE,
    HOPPER_LINE,
    HOPPER_TOML,
    NO_ENV,
    SPEC_BASELINES,
    TREE,
    TREE_DEFAULTS_TOML,
    TREE_LINE_TAIL,
    U32_MAX,
    tree_gb10,
    tree_levers,
    write_hw,
    write_levers,
)

# --------------------------------------------------------------------------- docs


def test_the_docs_cover_every_lever_and_variable() -> None:
    text = render_docs()
    for row in LEVERS:
        assert f"| `{row.name}` |" in text
        for variable in row.all_variables():
            assert f"| `{variable}` |" in text
    for band, names in enumerate(GEMV_BANDS):
        assert f"| `w8a8_gemv_entries` | {band} | `{names[0]}`, `{names[1]}` |" in text


def test_docs_defaults_md_is_generated() -> None:
    path = REPO / "docs" / "defaults.md"
    assert path.read_text(encoding="utf-8") == render_docs(), (
        "docs/defaults.md is stale: run "
        "`.venv/bin/python -c 'from metrale_orch.defaults import write_docs; write_docs(\".\")'`"
    )


def test_write_docs_regenerates_the_page_and_is_idempotent(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "defaults.md").write_text("stale\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("# x\n", encoding="utf-8")
    assert write_docs(tmp_path) == (tmp_path / "docs" / "defaults.md",)
    assert (tmp_path / "docs" / "defaults.md").read_text(encoding="utf-8") == render_docs()
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "# x\n"  # links, no copy
    assert write_docs(tmp_path) == ()


# --------------------------------------------------------------------------- CLI


def run_cli(root: Path, *args: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "defaults", *args], environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_prints_the_summary_line_under_the_given_environment(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", HOPPER_TOML)
    assert run_cli(tmp_path, "hopper") == (0, HOPPER_LINE + "\n", "")
    code, out, _ = run_cli(tmp_path, "hopper", environ={"METRALE_FFN_M16_TC": "on"})
    assert code == 0 and " ffn_m16_tc=on (env) " in out


def test_cli_json_shows_every_lever_value_and_source(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", HOPPER_TOML)
    code, out, _ = run_cli(
        tmp_path, "hopper", "--json", environ={"METRALE_ATTN_DECODE_SPLITK": " 4 "}
    )
    assert code == 0
    doc = json.loads(out)
    assert out == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert (doc["hw"], doc["sm_count"]) == ("hopper", 132)
    assert set(doc["levers"]) == set(SPEC_BASELINES)
    assert doc["levers"]["attn_decode_splitk"] == {"source": "env", "value": "4"}
    assert doc["levers"]["lm_head_batchm_max"] == {"source": "target", "value": 16}
    assert doc["levers"]["w8a8_prefill_max_m_widening"] == {"source": "target", "value": U32_MAX}
    assert doc["levers"]["ffn_gateup_fused"] == {"source": "target", "value": True}


def test_cli_unknown_hardware_exits_2_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    code, out, err = run_cli(tmp_path, "volta")
    assert (code, out) == (2, "")
    assert err.startswith("error: kernels/volta/HARDWARE.toml not found")
    code, _, err = run_cli(tmp_path, "../etc")
    assert code == 2 and "not a hardware name" in err


def test_cli_bad_table_exits_2_naming_the_key(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", "[defaults]\nlm_head_batchm_max = true\n")
    code, out, err = run_cli(tmp_path, "hopper")
    assert (code, out) == (2, "")
    assert err.startswith("error: kernels/hopper/HARDWARE.toml: [defaults] lm_head_batchm_max ")
    assert "Traceback" not in err


def test_cli_warns_when_the_file_does_not_parse(tmp_path: Path) -> None:
    write_hw(tmp_path, "gb10", "[defaults\n")
    code, out, err = run_cli(tmp_path, "gb10")
    assert code == 0
    assert out == format_levers(resolve(baseline("gb10"), NO_ENV.get)) + "\n"
    assert err.startswith("warning: kernels/gb10/HARDWARE.toml does not parse")


def test_cli_resolves_under_its_own_environment_not_the_process_cache(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", HOPPER_TOML)
    resolved({})
    code, out, _ = run_cli(tmp_path, "hopper", environ={"METRALE_GDN_PREFILL_TC": "0"})
    assert code == 0 and " gdn_prefill_tc=off (env) " in out


def test_cli_shows_the_trees_own_levers(tmp_path: Path) -> None:
    write_levers(tmp_path, TREE)
    write_hw(tmp_path, "gb10", TREE_DEFAULTS_TOML)
    code, out, err = run_cli(tmp_path, "gb10")
    assert (code, err) == (0, "")
    assert out == format_levers(resolve(tree_gb10(), NO_ENV.get)) + "\n"
    assert out.endswith(TREE_LINE_TAIL + "\n")
    code, out, _ = run_cli(tmp_path, "gb10", environ={"METRALE_MOE_ENTRIES": "a1,b1"})
    assert code == 0 and " moe_entries=a1/b1 (env) " in out
    code, out, _ = run_cli(tmp_path, "gb10", "--json")
    levers = json.loads(out)["levers"]
    assert levers["moe_entries"] == {"source": "target", "value": ["a2", "b3"]}
    assert levers["w8a8_gemv_entries"] == {"source": "target", "value": list(GEMV_BASELINE)}


def test_cli_docs_prints_the_reference_with_the_trees_levers(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    assert run_cli(tmp_path, "--docs") == (0, render_docs(), "")
    write_levers(tmp_path, TREE)
    assert run_cli(tmp_path, "--docs") == (0, render_docs(tree_levers()), "")
    code, out, err = run_cli(tmp_path, "gb10", "--docs")
    assert (code, out) == (2, "") and err.startswith("error: defaults --docs takes no HW")
    code, out, err = run_cli(tmp_path)
    assert (code, out) == (2, "") and "name a hardware" in err


@pytest.mark.parametrize(
    ("levers", "hardware", "message"),
    [
        (
            '[[lever]]\nname = "moe_x"\ntype = "u32"\nbaseline = 1\nvariables = []\n'
            'rule = "toggle"\n',
            "[defaults]\n",
            "error: kernels/LEVERS.toml: [[lever]] 'moe_x': rule 'toggle' works on bool levers",
        ),
        (
            None,
            "[defaults]\nmoe_x = 1\nmoe_y = true\n",
            "error: kernels/gb10/HARDWARE.toml: [defaults] has 2 unknown levers: 'moe_x', 'moe_y'",
        ),
    ],
)
def test_cli_a_bad_lever_declaration_exits_2_with_one_line(
    tmp_path: Path, levers: str | None, hardware: str, message: str
) -> None:
    if levers is not None:
        write_levers(tmp_path, levers)
    write_hw(tmp_path, "gb10", hardware)
    code, out, err = run_cli(tmp_path, "gb10")
    assert (code, out) == (2, "")
    assert err.startswith(message) and err.count("\n") == 1, err


# --------------------------------------------------------------------------- the build


def _plan_small_tree(root: Path) -> Any:

    layout = discover(root, Target(hardware="hw1", model="m1", quant="q1"))
    return plan_target(root, layout, builtin_toolchains(), identity="fake 1.0")


def test_levers_toml_is_a_file_dependency_and_part_of_every_signature(tmp_path: Path) -> None:

    root = small_tree(tmp_path / "repo")
    before = _plan_small_tree(root)
    assert "kernels/LEVERS.toml" not in before.file_dep_rels
    assert before.signature["levers"] == []
    assert "moe_rows_max_m" not in before.signature["defaults"]

    write_levers(root, TREE)
    after = _plan_small_tree(root)
    assert "kernels/LEVERS.toml" in after.file_dep_rels
    assert root / "kernels" / "LEVERS.toml" in after.file_deps
    assert after.signature["levers"] == DeclaredLevers(file=None, levers=tree_levers()).to_dict()
    assert after.signature["defaults"]["moe_rows_max_m"] == 64
    assert after.signature["defaults"]["moe_entries"] == ["a1", "b1"]
    assert isinstance(after.defaults, TreeDefaults)
    # Compiles are unaffected: the baked defaults are not compiler inputs.
    assert [m.argv for m in after.modules] == [m.argv for m in before.modules]

    # A changed declaration changes the signature (and so re-runs every target).
    write_levers(root, TREE.replace("baseline = 64", "baseline = 65"))
    edited = _plan_small_tree(root)
    assert edited.signature["levers"] != after.signature["levers"]
    assert edited.signature["defaults"]["moe_rows_max_m"] == 65

    write_levers(root, "[[lever]]\nname = 3\n")
    with pytest.raises(LeverDeclarationError, match=r"kernels/LEVERS\.toml: \[\[lever\]\] #1"):
        _plan_small_tree(root)


def test_defaults_imports_nothing_of_the_package_but_errors() -> None:

    modules: set[str] = set()
    for file in Path(D.__file__).parent.glob("*.py"):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    outside = {m for m in modules if m.startswith("metrale_orch")}
    outside = {m for m in outside if not m.startswith("metrale_orch.defaults.")}
    assert outside == {"metrale_orch.errors"}
