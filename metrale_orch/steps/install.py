"""Install one target's outputs: artefacts, baked defaults, and the manifest last.

Order keeps every manifest on disk truthful: the old manifest goes first when
anything changes, the new one (:class:`~metrale_orch.manifest.Manifest`) is
written last, vouching for the files beside it; files no longer produced are
removed. Each write is atomic and skipped when the bytes are already there.

Only a build whose every module was obtained installs: a failed build leaves the
target's directory as the last good build left it (its artefacts, its manifest), so
nothing wrong is installed and nothing is lost; the modules it did obtain are in the
cache for the next build. doit's database keeps the record of that last good build
while its artefacts stay intact (:mod:`metrale_orch.tasks.database`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from metrale_orch.canonical import readable_json
from metrale_orch.defaults import render_defaults_header, render_defaults_json
from metrale_orch.fsutil import FileState, SameBytes, bytes_digest, file_state, write_if_changed
from metrale_orch.manifest import Manifest, ManifestShadow
from metrale_orch.paths import MANIFEST_NAME, root_relative, target_dir
from metrale_orch.steps.dropped import Drop
from metrale_orch.steps.errors import StageError
from metrale_orch.steps.plan_values import TargetPlan
from metrale_orch.steps.results import ModuleResult
from metrale_orch.steps.signature import shadow_dict
from metrale_orch.tree import Layout

__all__ = ["DEFAULTS_HEADER", "DEFAULTS_JSON", "install", "plan_manifest"]

DEFAULTS_JSON = "target_defaults.json"
DEFAULTS_HEADER = "target_defaults.h"


def plan_manifest(
    root: Path,
    plan: TargetPlan,
    layout: Layout,
    results: Sequence[ModuleResult],
    *,
    dropped: Sequence[Drop],
) -> Manifest:
    """The ``manifest.json`` of SPEC 4.1 (pure); ``dropped``: the target's shadow drops
    (:func:`metrale_orch.steps.dropped.shadow_drops`), listed whether exempted or not."""
    return Manifest(
        target=str(plan.target),
        arch=plan.arch,
        toolchain_name=plan.toolchain.name,
        toolchain_identity=plan.identity,
        flags=plan.flags,
        modules=tuple(r.manifest_entry() for r in results),
        shadows=tuple(ManifestShadow(**shadow_dict(s, root)) for s in layout.shadows),
        shadowed_dropped=tuple(sorted((d.module, d.kernel) for d in dropped)),
        defaults=render_defaults_json(plan.defaults),
    )


def install(
    root: Path,
    plan: TargetPlan,
    layout: Layout,
    results: Sequence[ModuleResult],
    outputs: Mapping[str, bytes],
    *,
    build_dir: Path,
    dropped: Sequence[Drop],
    same: SameBytes | None = None,
) -> tuple[str, dict[Path, FileState]]:
    """Install artefacts, defaults and the manifest of a build whose every module was
    obtained; remove stale files. Artefacts are written through ``same`` when given (a
    link to the run's earlier file of the same bytes: a module shared by many targets).

    Returns the root-relative manifest path and, per installed file,
    ``[mtime_ns, size, xxh3-64]`` of what was installed.

    Order keeps every manifest on disk truthful: the old manifest goes first
    when anything changes, the new one is written last.
    """
    target = str(plan.target)
    dest = target_dir(build_dir, plan.target.hardware, plan.target.model, plan.target.quant)
    manifest_path = dest / MANIFEST_NAME
    new_manifest = plan_manifest(root, plan, layout, results, dropped=dropped).encode()
    try:
        dest.mkdir(parents=True, exist_ok=True)
        old = manifest_path.read_bytes() if manifest_path.is_file() else None
        if old is not None and old != new_manifest:
            manifest_path.unlink()
        defaults_json = readable_json(render_defaults_json(plan.defaults))
        files = {
            **{dest / artefact: data for artefact, data in sorted(outputs.items())},
            dest / DEFAULTS_JSON: (defaults_json + "\n").encode(),
            dest / DEFAULTS_HEADER: render_defaults_header(plan.defaults).encode(),
            manifest_path: new_manifest,  # last: it vouches for the others
        }
        for path, data in files.items():
            write_if_changed(path, data, None if path == manifest_path else same)
        keep = {*outputs, DEFAULTS_JSON, DEFAULTS_HEADER, MANIFEST_NAME}
        for child in dest.iterdir():
            if child.name not in keep and (child.is_file() or child.is_symlink()):
                child.unlink()
    except OSError as exc:
        raise StageError(target, str(dest), f"cannot install the artefacts: {exc}") from None
    states: dict[Path, FileState] = {}
    for path, data in files.items():
        try:
            st = path.stat()
        except OSError as exc:
            raise StageError(target, str(path), f"cannot install the artefacts: {exc}") from None
        states[path] = file_state(st, bytes_digest(data), time.time_ns())
    return root_relative(manifest_path, root), states
