"""A compile's remote form is complete and honest: run by a worker that sees only the
input root and the form's environment (a materialising test double of a REAPI worker),
every module of a real target compiles to the same bytes as here; what names or reads a
file outside the input root runs here instead, counted.

These are the tests of this topic that run in-process; the others are in
``tests/scenarios/steps/test_remote_form.py``.
"""

from __future__ import annotations

import pytest

from metrale_orch.steps.remote_form import OUT_DIR, outside_input_root, platform_properties


def test_platform_pins_the_toolchain() -> None:
    props = platform_properties("nvcc", "Cuda compilation tools 13.0; gcc 14 | abc123", "img:1")
    assert list(props) == sorted(props)
    assert props["metrale-toolchain"] == "nvcc"
    assert props["metrale-toolchain-id"] == "abc123"
    assert props["metrale-toolchain-version"] == "Cuda compilation tools 13.0; gcc 14"
    assert props["container-image"] == "img:1"
    assert props["OSFamily"] and props["ISA"]


@pytest.mark.parametrize(
    ("words", "env", "outside"),
    [
        (["-I.", "-I../common", "x.cu", "-o", f"../{OUT_DIR}/m/x.ptx"], {}, ""),
        (["-I/opt/elsewhere/include", "x.cu"], {}, "/opt/elsewhere/include"),
        (["--include-path=/home/u/inc", "x.cu"], {}, "/home/u/inc"),
        (["-I../../../../outside", "x.cu"], {}, "../../../../outside"),
        (["-I/usr/local/cuda/include", "x.cu"], {}, ""),
        (["x.cu"], {"CPATH": "/home/u/include"}, "/home/u/include"),
        (["x.cu"], {"PATH": "/home/u/bin:/usr/bin"}, ""),
        # Found by an adversarial pass: paths inside option values and flag variables.
        (["-Xcompiler=-I/home/u/inc"], {}, "/home/u/inc"),
        (["-isystem/home/u/inc"], {}, "/home/u/inc"),
        (["-Xcompiler", "-isystem,/home/u/inc"], {}, "/home/u/inc"),
        (["-include/home/u/x.h"], {}, "/home/u/x.h"),
        (["x.cu"], {"NVCC_PREPEND_FLAGS": "-O2 -I/home/u/inc"}, "/home/u/inc"),
        (["x.cu"], {"NVCC_APPEND_FLAGS": "-Xcompiler -isystem/home/u"}, "/home/u"),
        (["x.cu"], {"CPATH": "/usr/local/cuda/include:/home/x"}, "/home/x"),
        (["--options-file", "../../../o.txt"], {}, "../../../o.txt"),
        (["-gencode=arch=compute_90a,code=sm_90a", "-DX=a/b", "-I/usr/local/cuda/x"], {}, ""),
    ],
)
def test_outside_input_root(words: list[str], env: dict[str, str], outside: str) -> None:
    found = outside_input_root(words, env, cwd="qwen3-8b/bf16", allowed=["/usr/local/cuda"])
    assert (outside in found) if outside else found == "", found
