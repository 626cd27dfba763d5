"""``metrale-orch layout`` names each module as the build installs it (issue 43).

``[modules]`` renames a module's artefact; the build, ``profile``, ``rdeps``, ``size`` and
``resources`` all use the installed name, so ``layout`` shows it beside the source (text)
and on the node (``--format``). ``--json`` stays ``dump(root)`` exactly (SPEC 1.7); the names
join it only with ``--installed-names`` (``module_names`` beside ``modules``). A bad
``[modules]`` table is one line naming the file and key, exit 2 (text, pictures); with
``--installed-names`` it is the target's ``module_names_error``, beside its layout.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from metrale_orch.cli import main
from metrale_orch.tree import dump
from tests.support.tree import files, hw, kernel_toml, model

Q, R = "h/m/q", "h/m/r"


def _tree(root: Path, leaf_modules: str = 'norm = "norm_q"') -> Path:
    """``attn`` renamed in common; ``norm`` renamed in common and, more specifically, in
    leaf ``q``; ``gemv`` never renamed."""
    hw(root, "h", arch="sm_90a")
    model(root, "h", "m")
    files(
        root,
        "kernels/h/common/attn.cu",
        "kernels/h/common/norm.cu",
        "kernels/h/common/gemv.cu",
        "kernels/h/m/q/act.cu",
        "kernels/h/m/r/act.cu",
    )
    kernel_toml(root, "kernels/h/common", raw='[modules]\nattn = "attn_decode"\nnorm = "norm_c"\n')
    kernel_toml(root, "kernels/h/m/q", raw=f"[modules]\n{leaf_modules}\n")
    return root


def _run(root: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *argv], environ={}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_text_shows_the_installed_name_where_modules_renames(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    code, out, err = _run(root, "layout", Q)
    assert (code, err) == (0, "")
    modules = out.split("modules:\n")[1].split("shadows:")[0].splitlines()
    assert modules == [
        "  act   kernels/h/m/q/act.cu  (leaf)",
        "  attn  kernels/h/common/attn.cu  (common)  installed as attn_decode",
        "  gemv  kernels/h/common/gemv.cu  (common)",
        "  norm  kernels/h/common/norm.cu  (common)  installed as norm_q",
    ]
    code, out, _ = _run(root, "layout", R)
    assert code == 0 and "  norm  kernels/h/common/norm.cu  (common)  installed as norm_c" in out


def test_plain_json_is_exactly_the_dump(tmp_path: Path) -> None:
    """SPEC 1.7: ``layout --json`` prints ``dump(root)``, with a rename or a bad table."""
    for leaf_modules, sub in (('norm = "norm_q"', "renamed"), ("norm = 3", "bad")):
        root = _tree(tmp_path / sub, leaf_modules)
        whole = dump(root)
        code, out, _ = _run(root, "layout", "--json")
        assert code == 0 and json.loads(out) == whole, sub
        code, out, _ = _run(root, "layout", "--json", Q)
        assert code == 0 and json.loads(out) == {Q: whole[Q]}, sub
        assert "module_names" not in out and "error" not in whole[Q], sub


def test_installed_names_adds_module_names_beside_modules(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    code, out, _ = _run(root, "layout", "--json", "--installed-names", Q)
    assert code == 0
    view = json.loads(out)[Q]
    assert view["modules"] == {
        "act": "kernels/h/m/q/act.cu",
        "attn": "kernels/h/common/attn.cu",
        "gemv": "kernels/h/common/gemv.cu",
        "norm": "kernels/h/common/norm.cu",
    }  # as before: by stem, to the source
    assert view["module_names"] == {
        "act": "act",
        "attn": "attn_decode",
        "gemv": "gemv",
        "norm": "norm_q",
    }
    assert {k: v for k, v in view.items() if k != "module_names"} == dump(root)[Q]
    code, out, _ = _run(root, "layout", "--json", "--installed-names")
    whole = json.loads(out)
    assert code == 0 and whole[Q] == view
    assert whole[R]["module_names"]["norm"] == "norm_c"


def test_installed_names_needs_json(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    code, out, err = _run(root, "layout", "--installed-names", Q)
    assert (code, out) == (2, "") and "--installed-names needs --json" in err


def test_pictures_label_renamed_modules(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    for fmt in ("dot", "mermaid"):
        code, out, err = _run(root, "layout", Q, "--format", fmt)
        assert (code, err) == (0, ""), fmt
        assert "attn.cu (installed as attn_decode)" in out
        assert "norm.cu (installed as norm_q)" in out
        assert "gemv.cu (installed" not in out


def test_a_bad_modules_table_is_one_line_exit_2(tmp_path: Path) -> None:
    root = _tree(tmp_path, leaf_modules="norm = 3")
    code, out, err = _run(root, "layout", Q)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: kernels/h/m/q/KERNEL.toml: [modules] norm: must be a module")
    spec = dump(root)
    code, out, _ = _run(root, "layout", "--json", "--installed-names", Q)
    view = json.loads(out)[Q]
    assert code == 2 and "[modules] norm" in view.pop("module_names_error")
    assert view == spec[Q]  # the layout is still shown, as dump gives it
    code, out, _ = _run(root, "layout", "--json", "--installed-names")
    whole = json.loads(out)
    assert code == 0 and "[modules] norm" in whole[Q]["module_names_error"]
    assert "module_names" not in whole[Q] and "error" not in whole[Q]
    assert whole[R]["module_names"]["attn"] == "attn_decode"  # the other target still shows
