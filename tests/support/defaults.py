"""Trees, tables and helpers the tests of the defaults share (SPEC 2; the in-process ones in
``tests/unit/defaults/``, the ones that start processes in ``tests/scenarios/defaults/``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from metrale_orch import defaults as D
from metrale_orch.defaults import (
    Kind,
    TargetDefaults,
    parse_defaults,
    parse_tree_levers,
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


def write_kernels_file(root: Path, relpath: str, text: str | bytes) -> Path:
    """Write ``root/kernels/relpath`` (parents made): text as UTF-8, bytes as they are."""
    path = root / "kernels" / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def write_levers(root: Path, text: str | bytes) -> Path:
    return write_kernels_file(root, "LEVERS.toml", text)


NO_ENV: dict[str, str] = {}

# SPEC 2.1: lever -> (type, baseline), in table order.
SPEC_BASELINES: dict[str, tuple[Kind, object]] = {
    "lm_head_batchm_max": (Kind.U32, 8),
    "ssm_batched_recurrent": (Kind.BOOL, False),
    "gdn_prefill_tc": (Kind.BOOL, False),
    "ssm_ba_gates_hopper": (Kind.BOOL, False),
    "fp8_act_quant_hopper": (Kind.BOOL, False),
    "decode_split_silu": (Kind.BOOL, True),
    "attn_decode_splitk": (Kind.STRING, "legacy"),
    "ffn_m16_tc": (Kind.BOOL, False),
    "attn_m16_tc": (Kind.BOOL, False),
    "lm_head_m16_tc": (Kind.BOOL, False),
    "attn_ncol_gemv": (Kind.BOOL, False),
    "ffn_gateup_fused": (Kind.BOOL, False),
    "w8a8_prefill_max_m_widening": (Kind.U32, U32_MAX),
    "w8a8_prefill_max_m_narrowing": (Kind.U32, U32_MAX),
    "ffn_w4a16_tc_rows_max_m": (Kind.U32, 0),
    "ffn_w4a16_bf16_tile": (Kind.BOOL, False),
    "w8a8_gemv_entries": (Kind.POINTS, ("mb1_ku8", "mb2", "mb4", "mb8", "mb16")),
}

# SPEC 2.1: the names each band of w8a8_gemv_entries accepts.
GEMV_BANDS = [
    ("mb1_ku8", "mb1_ku2_o4"),
    ("mb2", "mb2_ku2_o2"),
    ("mb4", "mb4_ku2_o2"),
    ("mb8", "mb8_ku2_o2"),
    ("mb16", "mb16_ku1_o2"),
]

# SPEC 2.2: lever -> (own variable, umbrella, kill switch).
SPEC_VARIABLES: dict[str, tuple[str | None, str | None, str | None]] = {
    "lm_head_batchm_max": ("METRALE_LM_HEAD_BATCHM_MAX", None, None),
    "ssm_batched_recurrent": ("METRALE_SSM_BATCHED_RECURRENT", None, None),
    "gdn_prefill_tc": ("METRALE_GDN_PREFILL_TC", None, None),
    "ssm_ba_gates_hopper": ("METRALE_SSM_BA_GATES_HOPPER", None, None),
    "fp8_act_quant_hopper": ("METRALE_FP8_ACT_QUANT_HOPPER", None, None),
    "decode_split_silu": (None, None, "METRALE_NO_DECODE_SPLIT_SILU"),
    "attn_decode_splitk": ("METRALE_ATTN_DECODE_SPLITK", None, None),
    "ffn_m16_tc": ("METRALE_FFN_M16_TC", "METRALE_M16_TC", None),
    "attn_m16_tc": ("METRALE_ATTN_M16_TC", "METRALE_M16_TC", None),
    "lm_head_m16_tc": ("METRALE_LM_HEAD_M16_TC", None, None),
    "attn_ncol_gemv": ("METRALE_ATTN_NCOL_GEMV", None, "METRALE_NO_ATTN_DECODE_BATCH"),
    "ffn_gateup_fused": ("METRALE_FFN_GATEUP_FUSED", None, None),
    "w8a8_prefill_max_m_widening": ("METRALE_W8A8_PREFILL_MAX_M_WIDENING", None, None),
    "w8a8_prefill_max_m_narrowing": ("METRALE_W8A8_PREFILL_MAX_M_NARROWING", None, None),
    "ffn_w4a16_tc_rows_max_m": ("METRALE_FFN_W4A16_TC_ROWS_MAX_M", None, None),
    "ffn_w4a16_bf16_tile": ("METRALE_FFN_W4A16_BF16_TILE", None, None),
    "w8a8_gemv_entries": ("METRALE_W8A8_GEMV_ENTRIES", None, None),
}

HOPPER_LINE = (
    "target defaults (hopper): sm_count=132 lm_head_batchm_max=16 ssm_batched_recurrent=on "
    "gdn_prefill_tc=on ssm_ba_gates_hopper=on decode_split_silu=on attn_decode_splitk=auto "
    "ffn_m16_tc=off attn_m16_tc=on lm_head_m16_tc=on attn_ncol_gemv=off ffn_gateup_fused=on "
    "fp8_act_quant_hopper=on w8a8_prefill_max_m=max/max ffn_w4a16_tc_rows_max_m=0 "
    "ffn_w4a16_bf16_tile=off w8a8_gemv_entries=mb1_ku8/mb2/mb4/mb8/mb16"
)
TREE_LINE_TAIL = (
    " w8a8_gemv_entries=mb1_ku8/mb2/mb4/mb8/mb16 moe_rows_max_m=128 moe_tc=on moe_splitk=4 "
    "moe_batchm_max=4 moe_entries=a2/b3 moe_cap=4294967295/7"
)


def tree_levers() -> tuple[D.Lever, ...]:
    return parse_tree_levers(tomllib.loads(TREE))


def tree_gb10() -> TargetDefaults:
    return parse_defaults("gb10", tomllib.loads(TREE_DEFAULTS_TOML), levers=tree_levers())


def doc_with(defaults: object = None, hardware: object = None) -> dict[str, object]:
    doc: dict[str, object] = {}
    if hardware is not None:
        doc["hardware"] = hardware
    if defaults is not None:
        doc["defaults"] = defaults
    return doc


def write_hw(root: Path, hw: str, text: str | bytes) -> Path:
    return write_kernels_file(root, f"{hw}/HARDWARE.toml", text)


def gemv(value: object) -> TargetDefaults:
    return parse_defaults("gb10", doc_with({"w8a8_gemv_entries": value}))
