"""One smoke run of a hardware: :func:`run_smoke` checks every built target and returns a report.

For each target it reads the manifest the build installed, the target's smoke
cases and each module's artefact; the static check runs always, the numbers when
the probe found a device that can run the artefact's arch. Every problem becomes
a failed :class:`~metrale_orch.smoke.report.CaseResult` (never an exception),
except a broken tree walk (``LayoutError``). Writes nothing.

NumPy is needed only for the numbers: :mod:`~metrale_orch.smoke.dtypes` is loaded
by :meth:`_Run.case` when a case runs on a device (CuPy, which finds the device,
depends on NumPy), so the static checks run without the ``gpu`` extra.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from metrale_orch.paths import MANIFEST_NAME, root_relative, target_dir
from metrale_orch.smoke.arch import arch_runnable
from metrale_orch.smoke.artefacts import (
    ArtefactInfo,
    inspect_artefact,
    static_problems,
    xxh3_matches,
)
from metrale_orch.smoke.cases import SmokeCase, scan_cases
from metrale_orch.smoke.device import (
    CupyLauncher,
    DeviceProbe,
    DeviceStatus,
    Launcher,
    probe_device,
)
from metrale_orch.smoke.errors import SmokeCaseError, SmokeError
from metrale_orch.smoke.report import CaseResult, Outcome, SmokeReport
from metrale_orch.tree import Layout, LayoutError, Target, TreeSnapshot, discover, walk

__all__ = ["REFS_FILE", "Reference", "load_references", "run_smoke"]

#: The references of every case, under ``kernels/``.
REFS_FILE = "smoke_refs.py"

#: A NumPy reference: the case's decoded inputs by name -> its expected outputs by name.
Reference = Callable[[dict[str, object]], object]


def load_references(path: Path) -> Mapping[str, Reference]:
    """Import ``kernels/smoke_refs.py`` by file path (not via sys.path) and return its callables.

    Raises :class:`SmokeError` when it is missing or fails to import.
    """
    if not path.is_file():
        raise SmokeError(f"{path}: no such file; smoke cases name references defined there")
    spec = importlib.util.spec_from_file_location("_metrale_smoke_refs", path)
    if spec is None or spec.loader is None:
        raise SmokeError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # user code: any failure is reported, not raised through
        raise SmokeError(f"{path}: import failed: {type(exc).__name__}: {exc}") from None
    return MappingProxyType(
        {k: v for k, v in vars(module).items() if callable(v) and not k.startswith("_")}
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _ModulePlan:
    name: str
    stem: str
    artefact: Path
    xxh3: str
    cases: tuple[SmokeCase, ...]


def _artefact_path(root: Path, manifest_dir: Path, artefact: str) -> Path:
    near = manifest_dir / artefact
    if near.is_file() or "/" not in artefact:
        return near
    return root / artefact


class _Run:
    """One smoke run's mutable state: results, the lazily loaded references."""

    def __init__(
        self, root: Path, status: DeviceStatus, launcher: Launcher, refs_path: Path
    ) -> None:
        self.root = root
        self.status = status
        self.launcher = launcher
        self.refs_path = refs_path
        self._refs: Mapping[str, Reference] | SmokeError | None = None
        self.results: list[CaseResult] = []

    def refs(self) -> Mapping[str, Reference]:
        if self._refs is None:
            try:
                self._refs = load_references(self.refs_path)
            except SmokeError as exc:
                self._refs = exc
        if isinstance(self._refs, SmokeError):
            raise self._refs
        return self._refs

    def add(
        self,
        *,
        target: str,
        module: str,
        case: str,
        outcome: Outcome,
        message: str,
        detail: str = "",
        max_abs_error: float | None = None,
        seconds: float = 0.0,
    ) -> None:
        self.results.append(
            CaseResult(
                target=target,
                module=module,
                case=case,
                outcome=outcome,
                message=message,
                detail=detail,
                max_abs_error=max_abs_error,
                seconds=seconds,
            )
        )

    def manifest_result(self, target: str, case: str, outcome: Outcome, message: str) -> None:
        self.add(target=target, module="(manifest)", case=case, outcome=outcome, message=message)

    def target(self, build_dir: Path, layout: Layout) -> None:
        target = str(layout.target)
        out_dir = target_dir(
            build_dir, layout.target.hardware, layout.target.model, layout.target.quant
        )
        manifest_path = out_dir / MANIFEST_NAME
        rel_manifest = root_relative(manifest_path, self.root)
        try:
            cases = scan_cases(self.root, layout)
        except SmokeCaseError as exc:
            self.add(
                target=target,
                module="(cases)",
                case="parse",
                outcome="failed",
                message=str(exc),
            )
            cases = ()
        if not manifest_path.is_file():
            self.manifest_result(
                target,
                "build",
                "skipped",
                f"{rel_manifest} is missing: the target was not built"
                " (toolchain not installed, or run `doit build` first)",
            )
            return
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if manifest.get("schema") != 1:
                raise ValueError(f"schema {manifest.get('schema')!r}, expected 1")
            arch = str(manifest["arch"])
            modules = manifest["modules"]
            if not isinstance(modules, list):
                raise ValueError("modules is not a list")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.manifest_result(
                target,
                "read",
                "failed",
                f"{rel_manifest}: unreadable manifest ({exc}); rebuild the target",
            )
            return
        declared = layout.hardware.arch
        if declared and declared != arch:
            self.manifest_result(
                target,
                "arch",
                "failed",
                f"{rel_manifest} says arch {arch!r} but"
                f" {root_relative(layout.hardware.path, self.root)} declares {declared!r}; rebuild",
            )
        by_stem: dict[str, Mapping[str, object]] = {}
        for m in modules:
            if isinstance(m, dict) and isinstance(m.get("stem"), str):
                by_stem[m["stem"]] = m
        stems = [stem for stem, _ in layout.modules()]
        for stem in sorted(set(stems) | set(by_stem)):
            mod_cases = tuple(c for c in cases if c.module == stem)
            entry = by_stem.get(stem)
            if entry is None:
                self.add(
                    target=target,
                    module=stem,
                    case="static",
                    outcome="failed",
                    message=f"module {stem!r} is not in {rel_manifest}; rebuild the target",
                )
                for c in mod_cases:
                    self.add(
                        target=target,
                        module=stem,
                        case=c.name,
                        outcome="skipped",
                        message="no artefact for the module",
                    )
                continue
            plan = _ModulePlan(
                name=str(entry.get("name", stem)),
                stem=stem,
                artefact=_artefact_path(self.root, out_dir, str(entry.get("artefact", ""))),
                xxh3=str(entry.get("xxh3", "")),
                cases=mod_cases,
            )
            self.module(target, arch, plan)

    def module(self, target: str, arch: str, plan: _ModulePlan) -> None:
        start = time.perf_counter()
        label = plan.name
        rel = root_relative(plan.artefact, self.root)
        expected = sorted({c.entry for c in plan.cases})
        info: ArtefactInfo | None = None
        problems: list[str] = []
        try:
            data = plan.artefact.read_bytes()
        except OSError as exc:
            problems.append(f"{rel}: cannot be read ({exc.strerror or exc}); rebuild the target")
        else:
            if not plan.xxh3:
                problems.append(f"{MANIFEST_NAME} has no xxh3 for the module")
            elif not xxh3_matches(data, plan.xxh3):
                problems.append(f"{rel}: content does not match the manifest's xxh3; rebuild")
            try:
                info = inspect_artefact(data)
            except SmokeError as exc:
                problems.append(f"{rel}: {exc}")
            else:
                problems.extend(static_problems(info, arch, expected))
        detail = f"artefact: {rel}\nexpected entries: {', '.join(expected) or '(none)'}"
        if info is not None:
            detail += "\n" + info.describe()
            if not info.entries_complete:
                detail += "\nentries not fully checked: compressed fatbin images"
        self.add(
            target=target,
            module=label,
            case="static",
            outcome="failed" if problems else "passed",
            message="; ".join(problems) if problems else f"{info.kind if info else '?'} {arch} ok",
            detail=detail,
            seconds=time.perf_counter() - start,
        )
        for case in plan.cases:
            self.case(target, label, arch, plan.artefact, info, case, static_ok=not problems)

    def _skip_reason(
        self, arch: str, info: ArtefactInfo | None, case: SmokeCase, *, static_ok: bool
    ) -> str:
        """Why the numeric check of ``case`` does not run on this device ("" when it runs)."""
        status = self.status
        if info is not None and info.kind == "hsaco":
            return (
                f"numeric smoke skipped: {arch} is an AMDGPU code object; the numeric smoke "
                "launches on CUDA devices only"
            )
        if status.device is None:
            return f"numeric smoke skipped: {status.reason}"
        if not static_ok or info is None:
            return "numeric smoke skipped: the static check failed"
        cc = status.device.cc
        why = arch_runnable(arch, info.kind, cc)
        if why is not None:
            return f"numeric smoke skipped: {status.device.name}: {why}"
        if case.min_cc is not None and cc < case.min_cc:
            return (
                f"numeric smoke skipped: case needs compute capability >="
                f" {case.min_cc[0]}.{case.min_cc[1]}, device is {cc[0]}.{cc[1]}"
            )
        return ""

    def case(
        self,
        target: str,
        label: str,
        arch: str,
        artefact: Path,
        info: ArtefactInfo | None,
        case: SmokeCase,
        *,
        static_ok: bool,
    ) -> None:
        status = self.status
        skip = "" if status.error else self._skip_reason(arch, info, case, static_ok=static_ok)
        if status.error or skip:
            self.add(
                target=target,
                module=label,
                case=case.name,
                outcome="failed" if status.error else "skipped",
                message=status.error or skip,
            )
            return
        # NumPy (the gpu extra) loads here, only when numbers run; see the module's docstring.
        from metrale_orch.smoke.dtypes import compare_outputs, make_inputs

        start = time.perf_counter()
        outcome: Outcome
        max_abs_error: float | None = None
        try:
            refs = self.refs()
            ref = refs.get(case.reference)
            if ref is None:
                raise SmokeError(
                    f"{case.source}: case {case.name!r}: reference {case.reference!r} is not"
                    f" defined in {root_relative(self.refs_path, self.root)}"
                )
            inputs = make_inputs(case)
            got = self.launcher(artefact, case, inputs.params)
            try:
                want = ref(dict(inputs.reference_args))
            except Exception as exc:  # user code
                raise SmokeError(
                    f"reference {case.reference!r} raised {type(exc).__name__}: {exc}"
                ) from None
            if not isinstance(want, Mapping):
                raise SmokeError(f"reference {case.reference!r} did not return a dict")
            cmp = compare_outputs(case, got, want)
        except SmokeError as exc:
            outcome, message = "failed", str(exc)
        except Exception as exc:  # CuPy/CUDA errors on a present device are failures
            outcome = "failed"
            message = f"launch of {case.entry} failed: {type(exc).__name__}: {exc}"
        else:
            outcome = "passed" if cmp.ok else "failed"
            message = cmp.message if not cmp.ok else f"max abs error {cmp.max_abs_error:.4g}"
            max_abs_error = cmp.max_abs_error
        self.add(
            target=target,
            module=label,
            case=case.name,
            outcome=outcome,
            message=message,
            max_abs_error=max_abs_error,
            seconds=time.perf_counter() - start,
        )


def _sort_key(r: CaseResult) -> tuple[str, str, int, str]:
    return (r.target, r.module, 0 if r.case == "static" else 1, r.case)


def run_smoke(
    root: Path | str,
    hw: str,
    *,
    build_dir: Path | str | None = None,
    targets: Sequence[str] | None = None,
    layouts: Sequence[tuple[Target, Layout | LayoutError]] | None = None,
    probe: DeviceProbe | None = None,
    launcher: Launcher | None = None,
) -> SmokeReport:
    """Smoke-test every built target of hardware ``hw``; returns the report (writes nothing).

    Targets: ``layouts`` when given (already resolved), else ``targets``
    (``hw/model/quant`` strings) resolved here, else every walked target of
    ``hw``. ``build_dir`` defaults to ``<root>/build``. ``probe`` defaults to
    :func:`probe_device`, ``launcher`` to a :class:`CupyLauncher`. A tree
    error of a target becomes a failed result; only a broken tree walk raises
    (``LayoutError``).
    """
    root = Path(root)
    out = Path(build_dir) if build_dir is not None else root / "build"
    if layouts is None:
        snap = TreeSnapshot(root)
        names = (
            [Target.parse(t) for t in targets]
            if targets is not None
            else [t for t in walk(root, snap) if t.hardware == hw]
        )
        resolved: list[tuple[Target, Layout | LayoutError]] = []
        for t in names:
            try:
                resolved.append((t, discover(root, t, snap)))
            except LayoutError as exc:
                resolved.append((t, exc))
        layouts = resolved
    status = (probe or probe_device)()
    run = _Run(root, status, launcher or CupyLauncher(), root / "kernels" / REFS_FILE)
    for target, result in sorted(layouts, key=lambda p: p[0]):
        if target.hardware != hw:
            continue
        if isinstance(result, LayoutError):
            run.add(
                target=str(target),
                module="(layout)",
                case="resolve",
                outcome="failed",
                message=str(result),
            )
            continue
        run.target(out, result)
    results = sorted(run.results, key=_sort_key)
    return SmokeReport(hw=hw, device=status, results=tuple(results))
