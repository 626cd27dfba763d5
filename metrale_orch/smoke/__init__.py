"""Smoke tests of a hardware's artefacts (SPEC 3.5): static checks always, numbers on a device.

For every target of one hardware, :func:`run_smoke` reads the target's
``manifest.json`` (SPEC 4.1) and its smoke cases (``SMOKE.toml`` beside the
kernels, format in the team's SMOKE_FORMAT), then:

- **statically** checks every artefact, with no GPU: the manifest's xxh3 of
  the file matches; PTX ``.target`` equals the manifest arch; a cubin is a
  CUDA ELF for that SM (and variant, where ptxas recorded it); a fatbin holds
  an image for it; every ``extern "C"`` entry a smoke case names is present.
  Entries, registers and shared memory are reported;
- **numerically**, when CuPy finds a device whose compute capability can run
  the artefact's arch, loads the module with ``cupy.RawModule``, launches each
  case on inputs drawn from ``numpy.random.default_rng(seed)``, and compares
  with the NumPy reference of ``kernels/smoke_refs.py`` within the case's
  tolerance, reporting the max abs error. Otherwise the numeric part is
  skipped with the exact reason.

The result is a :class:`SmokeReport`; :func:`write_junit` writes
``build/smoke-<hw>.xml``. CuPy and NumPy are optional (``metrale-orch[gpu]``);
the static part needs neither.

Modules, from the bottom: ``errors``; ``arch`` (arch names, what runs where);
``ptx`` and ``elf`` (the artefact readers); ``cases`` (``SMOKE.toml``);
``artefacts`` (the static check); ``device`` (probe and launcher, the one CuPy
import); ``report`` (results, JUnit); ``dtypes`` (conversions, inputs,
comparison: needs NumPy, so it is not imported here); ``run`` (:func:`run_smoke`).
The doit tasks live in :mod:`metrale_orch.tasks.smoke`.
"""

from __future__ import annotations

from metrale_orch.smoke.arch import ArchSpec, ArtefactKind, arch_runnable, parse_arch
from metrale_orch.smoke.artefacts import ArtefactInfo, inspect_artefact, static_problems
from metrale_orch.smoke.cases import (
    ARG_DTYPES,
    SMOKE_TOML,
    ArgKind,
    ArgSpec,
    SmokeCase,
    merge_cases,
    parse_smoke_doc,
    scan_cases,
)
from metrale_orch.smoke.device import (
    CupyLauncher,
    DeviceInfo,
    DeviceProbe,
    DeviceStatus,
    Launcher,
    probe_device,
)
from metrale_orch.smoke.errors import SmokeCaseError, SmokeError
from metrale_orch.smoke.report import CaseResult, Outcome, SmokeReport, write_junit
from metrale_orch.smoke.run import REFS_FILE, Reference, load_references, run_smoke

__all__ = [
    "ARG_DTYPES",
    "REFS_FILE",
    "SMOKE_TOML",
    "ArchSpec",
    "ArgKind",
    "ArgSpec",
    "ArtefactInfo",
    "ArtefactKind",
    "CaseResult",
    "CupyLauncher",
    "DeviceInfo",
    "DeviceProbe",
    "DeviceStatus",
    "Launcher",
    "Outcome",
    "Reference",
    "SmokeCase",
    "SmokeCaseError",
    "SmokeError",
    "SmokeReport",
    "arch_runnable",
    "inspect_artefact",
    "load_references",
    "merge_cases",
    "parse_arch",
    "parse_smoke_doc",
    "probe_device",
    "run_smoke",
    "scan_cases",
    "static_problems",
    "write_junit",
]
