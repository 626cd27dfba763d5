"""The release gate's coverage check (metrale_orch.gate) and ``metrale-orch coverage``.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/gate/test_coverage.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.config import ConfigError, load_config
from metrale_orch.gate import (
    CUDA_OF_ISA,
    KernelListError,
    Problem,
    exported_entries,
    family_kernels,
    fusion_kernels,
    isa_problem,
    read_artefact,
)
from metrale_orch.gate.assemble import ptxas_complaint
from metrale_orch.gate.entries import mangled_as
from metrale_orch.gate.families import NamedKernel

# --- values ------------------------------------------------------------------------------


def test_family_and_fusion_lists_in_both_spellings() -> None:
    doc = {
        "family": [
            {"name": "a", "kernels": ["attn::decode", "attn_kernel::prefill"]},
            {"name": "empty"},
        ],
        "families": {"other": {"variants": ["x"]}},  # another tool's table: ignored
    }
    assert family_kernels(doc, "F.toml") == [
        NamedKernel("attn", "decode", "F.toml"),
        NamedKernel("attn_kernel", "prefill", "F.toml"),
    ]
    rules = {
        "rule": [
            {
                "kernels": [{"module": "norm", "func": "rmsnorm", "note": "x"}],
                "run": [{"launches": [{"module": "rope", "func": "rope_f"}]}],
            }
        ],
        "fusion": [{"kernels": ["a", "b"]}],  # not this format's: ignored
    }
    assert fusion_kernels(rules, "R.toml") == [
        NamedKernel("norm", "rmsnorm", "R.toml"),
        NamedKernel("rope", "rope_f", "R.toml"),
    ]
    assert family_kernels({}, "F.toml") == [] and fusion_kernels({}, "R.toml") == []


@pytest.mark.parametrize(
    ("reader", "doc", "key"),
    [
        (family_kernels, {"family": {"kernels": []}}, "[[family]]"),
        (family_kernels, {"family": [{"kernels": "attn::x"}]}, "family[0].kernels"),
        (family_kernels, {"family": [{"kernels": ["attn"]}]}, "family[0].kernels[0]"),
        (family_kernels, {"family": [{"kernels": ["::x"]}]}, "family[0].kernels[0]"),
        (family_kernels, {"family": [{"kernels": [3]}]}, "family[0].kernels[0]"),
        (fusion_kernels, {"rule": [{"kernels": ["a::b"]}]}, "rule[0].kernels[0]"),
        (fusion_kernels, {"rule": [{"kernels": [{"module": "a"}]}]}, "rule[0].kernels[0]"),
        (
            fusion_kernels,
            {"rule": [{"run": [{"launches": [{"module": "a", "func": 1}]}]}]},
            "rule[0].run[0].launches[0]",
        ),
        (fusion_kernels, {"rule": [{"run": {"launches": []}}]}, "rule[0].run"),
    ],
)
def test_misshapen_lists_name_the_file_and_key(
    reader: object, doc: dict[str, object], key: str
) -> None:
    assert callable(reader)
    with pytest.raises(KernelListError) as info:
        reader(doc, "kernels/hw/common/X.toml")
    assert (info.value.path, info.value.key) == ("kernels/hw/common/X.toml", key)
    assert str(info.value).startswith(f"kernels/hw/common/X.toml: {key}: ")


PTX = """\
//
// a hand-written module
//
.version 8.7
.target sm_90a
.address_size 64

// .visible .entry commented_out(
.visible .entry exported(
    .param .u64 p
)
{
    ret;
}
.entry internal(
)
{
    ret;
}
.visible .entry _Z4gemmPf(
    .param .u64 p
)
{
    ret;
}
"""


def test_exported_entries_of_ptx(tmp_path: Path) -> None:
    path = tmp_path / "m.ptx"
    path.write_text(PTX)
    assert exported_entries(path) == ("_Z4gemmPf", "exported")
    view = read_artefact(PTX.encode(), "m.ptx")
    assert (view.kind, view.arches, view.ptx_versions) == ("ptx", ("sm_90a",), ("8.7",))
    assert mangled_as("gemm", view.exports) == "_Z4gemmPf"
    assert mangled_as("gem", view.exports) is None and mangled_as("exported", ()) is None


def test_the_ptx_isa_table_and_the_deployment_minimum() -> None:
    assert CUDA_OF_ISA[(9, 0)] == (13, 0) and CUDA_OF_ISA[(8, 7)] == (12, 8)
    assert CUDA_OF_ISA[(8, 5)] == (12, 5) and CUDA_OF_ISA[(8, 6)] == (12, 7)
    assert isa_problem("8.7", (12, 8)) is None
    assert isa_problem("8.5", (12, 6)) is None  # 12.6 shipped PTX ISA 8.5 too
    assert isa_problem("9.0", (13, 0)) is None
    why = isa_problem("9.0", (12, 8))
    assert why is not None and why.startswith("PTX ISA 9.0 needs a CUDA 13.0 driver")
    newer = isa_problem("9.9", (12, 8))
    assert newer is not None and "newer than any CUDA 12.8 driver loads" in newer
    unknown = isa_problem("9.9", (14, 0))
    assert unknown is not None and "cannot tell" in unknown
    assert isa_problem("x", (12, 8)) == "PTX .version 'x' is not a PTX ISA version"


def test_ptxas_complaint_keeps_errors_and_drops_the_path() -> None:
    output = (
        "ptxas /tmp/p/build/x.ptx, line 25; error   : Unknown modifier '.op'\n"
        "ptxas fatal   : Ptx assembly aborted due to errors\n"
    )
    assert ptxas_complaint(output, "/tmp/p/build/x.ptx") == (
        "ptxas line 25; error : Unknown modifier '.op'"
    )
    assert ptxas_complaint("", "/x") == "ptxas failed"


@pytest.mark.parametrize(
    ("table", "key", "problem"),
    [
        ("[tool.metrale-orch.deploy.hw]\nmin_cuda = 12.8\n", "deploy.hw.min_cuda", "quoted"),
        ('[tool.metrale-orch.deploy.hw]\nmin_cuda = "12"\n', "deploy.hw.min_cuda", "MAJOR.MINOR"),
        ('[tool.metrale-orch.deploy.hw]\nmin_driver = "12.8"\n', "deploy.hw.min_driver", "unknown"),
        ('[tool.metrale-orch]\ndeploy = { hw = "12.8" }\n', "deploy.hw", "must be a table"),
    ],
)
def test_a_bad_deploy_setting_names_the_file_and_key(
    tmp_path: Path, table: str, key: str, problem: str
) -> None:
    (tmp_path / "pyproject.toml").write_text(table)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, {})
    assert (info.value.where, info.value.key) == ("pyproject.toml [tool.metrale-orch]", key)
    assert problem in info.value.problem


def test_the_deploy_setting_reads() -> None:
    config = load_config(Path("/nowhere"), {}, {"deploy": '{"hw": {"min_cuda": " 12.8 "}}'})
    assert config.deploy == {"hw": {"min_cuda": "12.8"}}
    assert config.to_dict()["deploy"] == {"hw": {"min_cuda": "12.8"}}
    assert Problem(target="t", module="m", what="w").line() == "t: m: w"
