"""Helpers the tests of defaults share (the in-process ones in ``tests/unit/defaults/``, the
ones that start processes in ``tests/scenarios/defaults/``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from metrale_orch.defaults import (
    TargetDefaults,
    parse_defaults,
)

U32_MAX = 4294967295
GEMV_BASELINE = ("mb1_ku8", "mb2", "mb4", "mb8", "mb16")

HOPPER_TOML = """\
[hardware]
arch = "sm_90a"
sm_count = 132

[defaults]
lm_head_batchm_max = 16
ssm_batched_recurrent = true
gdn_prefill_tc = true
ssm_ba_gates_hopper = true
fp8_act_quant_hopper = true
decode_split_silu = true
attn_decode_splitk = "auto"
ffn_m16_tc = false
attn_m16_tc = true
lm_head_m16_tc = true
attn_ncol_gemv = false
ffn_gateup_fused = true
"""

# A kernels/LEVERS.toml declaring one lever of each type and rule, a built-in re-declared
# identically, and a pair printed as one summary item.
TREE = """\
[[lever]]
name = "moe_rows_max_m"
type = "u32"
baseline = 64
variables = ["METRALE_MOE_ROWS_MAX_M"]
rule = "row-cap"

[[lever]]
name = "w8a8_gemv_entries"
type = "points"
baseline = ["mb1_ku8", "mb2", "mb4", "mb8", "mb16"]
variables = ["METRALE_W8A8_GEMV_ENTRIES"]
rule = "points"
points = [["mb1_ku8", "mb1_ku2_o4"], ["mb2", "mb2_ku2_o2"], ["mb4", "mb4_ku2_o2"],
          ["mb8", "mb8_ku2_o2"], ["mb16", "mb16_ku1_o2"]]

[[lever]]
name = "moe_tc"
type = "bool"
baseline = true
variables = ["METRALE_MOE_TC", "METRALE_M16_TC"]
kill = "METRALE_NO_MOE_TC"
rule = "toggle"
about = "tensor-core MoE decode"

[[lever]]
name = "moe_splitk"
type = "string"
baseline = "auto"
variables = ["METRALE_MOE_SPLITK"]
rule = "split-K"

[[lever]]
name = "moe_batchm_max"
type = "u32"
baseline = 4
variables = ["METRALE_MOE_BATCHM_MAX"]
rule = "head-band"

[[lever]]
name = "moe_entries"
type = "points"
baseline = ["a1", "b1"]
variables = ["METRALE_MOE_ENTRIES"]
rule = "points"
points = [["a1", "a2"], ["b1", "b2", "b3"]]

[[lever]]
name = "moe_cap_wide"
type = "u32"
baseline = 4294967295
variables = ["METRALE_MOE_CAP_WIDE"]
rule = "row-cap"
summary_name = "moe_cap"

[[lever]]
name = "moe_cap_narrow"
type = "u32"
baseline = 7
variables = ["METRALE_MOE_CAP_NARROW"]
rule = "row-cap"
summary_name = "moe_cap"
"""
TREE_DEFAULTS_TOML = """\
[hardware]
sm_count = 48

[defaults]
moe_rows_max_m = 128
moe_entries = [" a2 ", "b3"]
moe_splitk = "4"
lm_head_batchm_max = 12
"""


def hopper() -> TargetDefaults:
    return parse_defaults("hopper", tomllib.loads(HOPPER_TOML))


def _defines(header: str) -> dict[str, str]:
    return dict(re.findall(r"^#define (METRALE_\w+) (.+)$", header, flags=re.MULTILINE))


def write_levers(root: Path, text: str | bytes) -> Path:
    path = root / "kernels" / "LEVERS.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
