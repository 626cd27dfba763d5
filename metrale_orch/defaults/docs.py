"""The generated documentation of the defaults: ``docs/defaults.md``.

:func:`render_docs` is pure (the examples are resolved, not hand-written, so
they cannot drift from the code); :func:`write_docs` rewrites the file only when its
text changes. The README links to it (it no longer repeats it).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from metrale_orch.defaults.declaration import parse_defaults
from metrale_orch.defaults.errors import LEVERS_PATH, toml_repr
from metrale_orch.defaults.grammar import DENSE_GEMV_BATCHM_MAX_M, MAX_DECODE_SPLITS, U32_MAX
from metrale_orch.defaults.levers import BASELINE_SM_COUNT, LEVERS, Kind, Lever, Rule
from metrale_orch.defaults.resolution import format_levers, resolve
from metrale_orch.defaults.tree_levers import parse_tree_levers

__all__ = ["render_docs", "write_docs"]


_RULE_TEXT: Mapping[Rule, str] = {
    Rule.TOGGLE: (
        "variable absent: the declaration; trimmed, case-insensitive `0`, `false`, `off` or "
        "`no`: off; any other value, the empty string included: on"
    ),
    Rule.HEAD_BAND: (
        f"a u32 > 0: min(value, {DENSE_GEMV_BATCHM_MAX_M}); `0`, junk or empty: the "
        f"declaration, also clamped to {DENSE_GEMV_BATCHM_MAX_M}"
    ),
    Rule.ROW_CAP: "a u32 (`0` = never): that value; anything else: the declaration",
    Rule.SPLITK: (
        "`legacy`, `auto`, `0`/`off`/`false`/`no` (one split) or a u32 count clamped to "
        f"1..={MAX_DECODE_SPLITS}, trimmed and case-insensitive; anything else keeps the "
        "declaration (an unparseable declaration means `legacy`)"
    ),
    Rule.POINTS: (
        "the value split on `,`, each part trimmed; exactly one part per band, each a name "
        "of its band (case-sensitive): those points; anything else (a trailing comma makes "
        "one part too many, the empty string is one part) keeps the declaration"
    ),
}


def _doc_type(row: Lever) -> str:
    if row.rule is Rule.SPLITK:
        return "string (split-K policy)"
    if row.kind is Kind.POINTS:
        return f"points ({len(row.points)} bands)"
    return str(row.kind.value)


def _doc_baseline(row: Lever) -> str:
    if row.kind is Kind.BOOL:
        return "`true`" if row.baseline else "`false`"
    if row.kind in (Kind.STRING, Kind.POINTS):
        return f"`{toml_repr(row.baseline)}`"
    if row.max_label and row.baseline == U32_MAX:
        return f"`{row.baseline}` (`max`)"
    return f"`{row.baseline}`"


def _doc_variables(row: Lever) -> str:
    parts = []
    for i, variable in enumerate(row.variables):
        if i == 0:
            parts.append(f"`{variable}`")
        else:
            before = ", ".join(f"`{v}`" for v in row.variables[:i])
            parts.append(f"`{variable}` (read only when {before} is unset)")
    if row.kill is not None:
        parts.append(f"`{row.kill}` (kill switch: set to anything, forces off)")
    return "; ".join(parts) if parts else "none"


def _variable_rows(rows: Sequence[Lever]) -> Iterator[tuple[str, str, str]]:
    for row in rows:
        for i, variable in enumerate(row.variables):
            if i == 0:
                yield variable, row.name, f"overrides it ({row.rule.value})"
            else:
                before = ", ".join(f"`{v}`" for v in row.variables[:i])
                yield variable, row.name, f"overrides it when {before} is unset ({row.rule.value})"
        if row.kill is not None:
            yield row.kill, row.name, "forces it off when present, whatever the value"


_EXAMPLE_TOML = """\
[hardware]
sm_count = 132

[defaults]
lm_head_batchm_max = 16
attn_decode_splitk = "auto"
ffn_gateup_fused = true
w8a8_gemv_entries = ["mb1_ku2_o4", "mb2", "mb4_ku2_o2", "mb8", "mb16"]
"""

_EXAMPLE_LEVERS_TOML = """\
[[lever]]
name = "moe_decode_tc"
type = "bool"
baseline = false
variables = ["METRALE_MOE_DECODE_TC"]
rule = "toggle"
about = "tensor-core MoE decode"

[[lever]]
name = "moe_gemv_entries"
type = "points"
baseline = ["mb1", "mb4"]
variables = ["METRALE_MOE_GEMV_ENTRIES"]
rule = "points"
points = [["mb1", "mb1_ku2"], ["mb4", "mb4_ku2"]]
"""

_EXAMPLE_TREE_DEFAULTS = """\
[defaults]
moe_decode_tc = true
"""

_ENTRY_DOCS: tuple[tuple[str, str, str], ...] = (
    (
        "name",
        "required",
        "a lower-case name (`[a-z][a-z0-9_]*`): the `[defaults]` key and, "
        "upper-cased, the header's `METRALE_<NAME>`",
    ),
    ("type", "required", "`bool`, `u32`, `string` or `points`"),
    ("baseline", "required", "the value a hardware that does not declare it gets, of that type"),
    ("variables", "required", "the positive variables, the first present deciding (may be `[]`)"),
    ("kill", "toggles only", "a variable whose presence alone forces the lever off"),
    (
        "rule",
        "required",
        "`toggle` (bool), `head-band` or `row-cap` (u32), `split-K` (string), `points` (points)",
    ),
    ("points", "points only", 'the names each band accepts, e.g. `[["mb1", "mb1_ku2"], ["mb4"]]`'),
    (
        "summary_name",
        "optional",
        "the name it prints under in the summary line (default: "
        "`name`); levers declared one after another with one summary name print as "
        "`<summary_name>=<a>/<b>`",
    ),
    ("about", "optional", "what it selects, for these docs"),
)


def render_docs(levers: Sequence[Lever] = ()) -> str:
    """Markdown for the ``[defaults]`` table, every ``METRALE_*`` variable and
    ``kernels/LEVERS.toml``; ``levers``: a tree's own, listed after the built-in ones."""
    rows = (*LEVERS, *levers)
    example = parse_defaults("hopper", tomllib.loads(_EXAMPLE_TOML))
    out = [
        "## Target serving defaults",
        "",
        "`kernels/<hw>/HARDWARE.toml` may declare a `[defaults]` table: the serving levers every "
        "artefact of that hardware ships with. The build bakes it (with `[hardware] sm_count`, "
        f"default {BASELINE_SM_COUNT}, an integer in 1..={U32_MAX}) into "
        "`target_defaults.json` and `target_defaults.h`; the serving process resolves it against "
        "the `METRALE_*` variables below and logs one line, which `metrale-orch defaults <hw>` "
        "prints too.",
        "",
        "A missing or unparseable HARDWARE.toml, or no `[defaults]` table, means the baseline. "
        "Each key present replaces its lever; an unknown key, a wrong type or an out-of-range "
        "value is a build error naming the file and the key (all unknown keys at once). u32 "
        f"values are TOML integers in 0..={U32_MAX}; `{U32_MAX}` means no cap, and the two "
        "W8A8 prefill caps print it as `max`. A points value is an array of one name per band, "
        "in band order, each trimmed and one of its band's names (below).",
        "",
        "| lever | type | baseline | variable(s) | rule | selects |",
        "|---|---|---|---|---|---|",
    ]
    out += [
        f"| `{row.name}` | {_doc_type(row)} | {_doc_baseline(row)} | {_doc_variables(row)} "
        f"| {row.rule.value} | {row.about or f'declared in `{LEVERS_PATH}`'} |"
        for row in rows
    ]
    out += [
        "",
        "Schedule points: each band of a points lever accepts exactly these names.",
        "",
        "| lever | band | names |",
        "|---|---|---|",
    ]
    out += [
        f"| `{row.name}` | {band} | {', '.join(f'`{name}`' for name in names)} |"
        for row in rows
        for band, names in enumerate(row.points)
    ]
    out += [
        "",
        "Rules (a value is trimmed of whitespace first; a u32 is an optional `+` and decimal "
        f"digits, at most {U32_MAX}):",
        "",
    ]
    out += [f"- **{rule.value}**: {_RULE_TEXT[rule]}." for rule in Rule]
    out += [
        "",
        "Every variable (a value decided by one is tagged ` (env)` in the summary line):",
        "",
        "| variable | lever | effect |",
        "|---|---|---|",
    ]
    out += [
        f"| `{var}` | `{lever}` | {effect} |" for var, lever, effect in sorted(_variable_rows(rows))
    ]
    out += [
        "",
        "The build writes `target_defaults.json` (hw, sm_count and every lever; points as an "
        "array) and `target_defaults.h`, which defines `METRALE_<LEVER>` per lever (booleans "
        "as 0/1, u32 values with a `u` suffix, strings as a string literal, points as one "
        "string literal joined by `/`), `METRALE_TARGET_SM_COUNT` and `METRALE_TARGET_HW`.",
        "",
        "Example (`kernels/hopper/HARDWARE.toml`):",
        "",
        "```toml",
        _EXAMPLE_TOML.rstrip("\n"),
        "```",
        "",
        "`METRALE_M16_TC=1 metrale-orch defaults hopper` then prints (one line):",
        "",
        "```text",
        format_levers(resolve(example, {"METRALE_M16_TC": "1"}.get)),
        "```",
        "",
    ]
    out += _render_tree_docs()
    return "\n".join(out)


def _render_tree_docs() -> list[str]:
    tree = parse_tree_levers(tomllib.loads(_EXAMPLE_LEVERS_TOML))
    example = parse_defaults("gb10", tomllib.loads(_EXAMPLE_TREE_DEFAULTS), levers=tree)
    env = {"METRALE_MOE_GEMV_ENTRIES": "mb1_ku2, mb4"}
    out = [
        f"### Levers a tree declares (`{LEVERS_PATH}`)",
        "",
        "Upstream adds levers every few weeks; a tree need not wait for a metrale-orch "
        f"release: `{LEVERS_PATH}` declares more, one `[[lever]]` table each:",
        "",
        "| key | | meaning |",
        "|---|---|---|",
    ]
    out += [f"| `{key}` | {need} | {meaning} |" for key, need, meaning in _ENTRY_DOCS]
    out += [
        "",
        "A declared lever behaves exactly like a built-in one: a `[defaults]` key of every "
        "hardware, the same override rules, printed after the built-in ones in file order, "
        "baked into both files, shown by `metrale-orch defaults` (`--docs` prints this page "
        "with the tree's levers in the tables). Re-declaring a built-in lever identically is "
        "allowed, differently an error; a bad entry is an error naming the file, the lever and "
        "the key. The file is a dependency of every target.",
        "",
        f"Example (`{LEVERS_PATH}`):",
        "",
        "```toml",
        _EXAMPLE_LEVERS_TOML.rstrip("\n"),
        "```",
        "",
        "With `moe_decode_tc = true` in `kernels/gb10/HARDWARE.toml`'s `[defaults]`, "
        f'`METRALE_MOE_GEMV_ENTRIES="{env["METRALE_MOE_GEMV_ENTRIES"]}" metrale-orch defaults '
        "gb10` prints (one line):",
        "",
        "```text",
        format_levers(resolve(example, env.get)),
        "```",
        "",
    ]
    return out


def write_docs(root: Path | str) -> tuple[Path, ...]:
    """Regenerate ``docs/defaults.md`` under ``root``; returns the files it changed (I/O)."""
    text = render_docs()
    docs = Path(root) / "docs" / "defaults.md"
    if docs.is_file() and docs.read_text(encoding="utf-8") == text:
        return ()
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(text, encoding="utf-8")
    return (docs,)
