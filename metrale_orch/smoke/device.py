"""The CUDA device side of a smoke run: the probe and the launcher, through CuPy.

:func:`probe_device` never raises: no CuPy, no driver or no device is a
:class:`DeviceStatus` with the reason (the numbers are skipped), a failing device
one with the error. :class:`CupyLauncher` loads each artefact once and launches
cases on it. Both are injectable (:data:`DeviceProbe`, :class:`Launcher`) so the
run is testable without a GPU.

CuPy is optional (``metrale-orch[gpu]``) and slow to import: :func:`_cupy` is the
one place that imports it, when a probe or a launch needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from metrale_orch.extras import GPU, missing_extra
from metrale_orch.smoke.cases import SmokeCase

__all__ = [
    "CupyLauncher",
    "DeviceInfo",
    "DeviceProbe",
    "DeviceStatus",
    "Launcher",
    "probe_device",
]


def _cupy() -> ModuleType:
    """The CuPy module, imported on first use. Raises ImportError when it is not installed."""
    import cupy

    module: ModuleType = cupy
    return module


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """The CUDA device the numeric smoke runs on."""

    index: int
    name: str
    cc: tuple[int, int]

    def describe(self) -> str:
        """``NVIDIA H200 (cc 9.0)``."""
        return f"{self.name} (cc {self.cc[0]}.{self.cc[1]})"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceStatus:
    """Outcome of the device probe.

    ``device`` set: numbers can run. ``device`` None and ``error`` empty: no
    device (``reason`` says exactly why: skip). ``error`` set: a device is
    present but failed (every numeric case fails with it).
    """

    device: DeviceInfo | None = None
    reason: str = ""
    error: str = ""
    #: What to install for the numbers (``pip install 'metrale-orch[gpu]'``), or "".
    fix: str = ""


#: A device probe: returns the status; never raises. Tests inject their own.
DeviceProbe = Callable[[], DeviceStatus]


def probe_device(index: int = 0) -> DeviceStatus:
    """Ask CuPy for CUDA device ``index`` (CUDA_VISIBLE_DEVICES applies).

    No CuPy (ImportError), no driver (``RuntimeError`` "failed to load
    libcuda", or a driver version of 0) and no device
    (``CUDARuntimeError``, or a count of 0) give a status with the reason;
    a CUDA error while reading a present device's properties gives ``error``.
    """
    try:
        cupy = _cupy()
    except ImportError as exc:
        missing = missing_extra(exc, GPU, "numeric smoke")
        if missing is None:
            return DeviceStatus(reason=f"CuPy cannot be imported: {exc}")
        return DeviceStatus(reason=str(missing), fix=missing.fix)
    driver, runtime = cupy.cuda.driver, cupy.cuda.runtime
    try:
        if runtime.driverGetVersion() == 0:
            try:
                driver.ctxGetCurrent()
            except RuntimeError as exc:
                return DeviceStatus(reason=f"no CUDA driver: {exc}")
            return DeviceStatus(reason="no CUDA driver: cudaDriverGetVersion reports 0")
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as exc:
        return DeviceStatus(reason=f"no CUDA device: {exc}")
    except RuntimeError as exc:  # CuPy: "failed to load libcuda.so.1"
        return DeviceStatus(reason=f"no CUDA driver: {exc}")
    if count <= index:
        return DeviceStatus(reason=f"no CUDA device: the driver reports {count} device(s)")
    try:
        props = runtime.getDeviceProperties(index)
    except (runtime.CUDARuntimeError, driver.CUDADriverError) as exc:
        return DeviceStatus(error=f"CUDA device {index} is present but failed: {exc}")
    name = props.get("name", b"")
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    return DeviceStatus(
        device=DeviceInfo(
            index=index, name=str(name), cc=(int(props["major"]), int(props["minor"]))
        )
    )


class Launcher(Protocol):
    """Runs one case on the device: returns the out/inout storage arrays by name."""

    def __call__(
        self, artefact: Path, case: SmokeCase, params: Sequence[object]
    ) -> Mapping[str, object]: ...


@dataclass(slots=True)
class CupyLauncher:
    """Loads each artefact once with ``cupy.RawModule(path=...)`` and launches cases on it."""

    #: Loaded ``cupy.RawModule`` by artefact (CuPy has no type information).
    modules: dict[Path, Any] = field(default_factory=dict)

    def __call__(
        self, artefact: Path, case: SmokeCase, params: Sequence[object]
    ) -> Mapping[str, object]:
        cupy = _cupy()

        module = self.modules.get(artefact)
        if module is None:
            module = cupy.RawModule(path=str(artefact))
            self.modules[artefact] = module
        function = module.get_function(case.entry)
        if case.shared_bytes > 48 * 1024:
            function.max_dynamic_shared_size_bytes = case.shared_bytes
        device_args: list[object] = []
        buffers: dict[str, object] = {}
        for arg, value in zip(case.args, params, strict=True):
            if arg.kind == "scalar":
                device_args.append(value)
            else:
                buf = cupy.asarray(value)
                buffers[arg.name] = buf
                device_args.append(buf)
        function(case.grid, case.block, tuple(device_args), shared_mem=case.shared_bytes)
        cupy.cuda.Device().synchronize()
        return {
            arg.name: cupy.asnumpy(buffers[arg.name])
            for arg in case.args
            if arg.kind in ("out", "inout")
        }
