"""The results of a smoke run and their JUnit XML (``build/smoke-<hw>.xml``).

A :class:`SmokeReport` holds one :class:`CaseResult` per (target, module, case),
``case`` being "static" for the artefact's static check. The XML is rendered
deterministically (results sorted, attributes in a fixed order, times to the
millisecond) with the standard library's ElementTree, and written atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from xml.etree import ElementTree as ET

from metrale_orch.smoke.device import DeviceStatus

__all__ = ["CaseResult", "Outcome", "SmokeReport", "write_junit"]

#: How one testcase ended.
Outcome = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """One JUnit testcase: (target, module, case); ``case`` is "static" for the static check."""

    target: str
    module: str
    case: str
    outcome: Outcome
    message: str = ""
    #: Longer text (static summary, failure detail).
    detail: str = ""
    max_abs_error: float | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SmokeReport:
    """All results of one ``smoke:<hw>`` run, sorted by (target, module, static first, case)."""

    hw: str
    device: DeviceStatus
    results: tuple[CaseResult, ...]

    def count(self, outcome: Outcome) -> int:
        """Number of results with this outcome."""
        return sum(1 for r in self.results if r.outcome == outcome)

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return self.count("failed") == 0

    def summary_line(self) -> str:
        """``smoke hopper: 57 static passed, 57 numeric skipped (no CUDA device), 0 failed``.

        Static checks (``case == "static"``) and numeric cases are counted apart; a
        count of zero is left out except the static passes and the failures; the
        numeric part says where numbers ran, or in a few words why they did not.
        """
        device = self.device
        parts: list[str] = []
        for kind in ("static", "numeric"):
            group = [r for r in self.results if (r.case == "static") == (kind == "static")]
            for outcome in ("passed", "skipped"):
                n = sum(1 for r in group if r.outcome == outcome)
                if not n and (kind, outcome) != ("static", "passed"):
                    continue
                part = f"{n} {kind} {outcome}"
                if kind == "numeric" and outcome == "passed" and device.device:
                    part += f" (on {device.device.describe()})"
                elif kind == "numeric" and outcome == "skipped" and not device.device:
                    fix = f"; {device.fix}" if device.fix else ""
                    part += f" ({device.reason.split(':', 1)[0] or 'no device'}{fix})"
                parts.append(part)
        failed = f"{self.count('failed')} failed"
        if device.error:
            failed += f" (device error: {device.error})"
        return f"smoke {self.hw}: {', '.join(parts)}, {failed}"

    def failures(self) -> tuple[CaseResult, ...]:
        """The failed results, in order."""
        return tuple(r for r in self.results if r.outcome == "failed")

    def to_junit_xml(self) -> str:
        """The JUnit XML document: one testsuite per target, one testcase per result."""
        suites = ET.Element("testsuites", name=f"smoke:{self.hw}")
        by_target: dict[str, list[CaseResult]] = {}
        for r in self.results:
            by_target.setdefault(r.target, []).append(r)
        totals = {"tests": 0, "failures": 0, "skipped": 0}
        total_time = 0.0
        for target in sorted(by_target):
            rs = by_target[target]
            secs = sum(r.seconds for r in rs)
            total_time += secs
            suite = ET.SubElement(
                suites,
                "testsuite",
                name=target,
                tests=str(len(rs)),
                failures=str(sum(r.outcome == "failed" for r in rs)),
                errors="0",
                skipped=str(sum(r.outcome == "skipped" for r in rs)),
                time=f"{secs:.3f}",
            )
            props = ET.SubElement(suite, "properties")
            dev = self.device
            ET.SubElement(
                props,
                "property",
                name="device",
                value=dev.device.describe() if dev.device else "none",
            )
            if not dev.device:
                ET.SubElement(
                    props, "property", name="device_reason", value=dev.reason or dev.error
                )
            for r in rs:
                tc = ET.SubElement(
                    suite,
                    "testcase",
                    classname=r.target,
                    name=f"{r.module}::{r.case}",
                    time=f"{r.seconds:.3f}",
                )
                if r.outcome == "failed":
                    fail = ET.SubElement(tc, "failure", message=r.message, type="SmokeFailure")
                    fail.text = r.detail or r.message
                elif r.outcome == "skipped":
                    ET.SubElement(tc, "skipped", message=r.message)
                out = r.detail if r.outcome != "failed" else ""
                if r.max_abs_error is not None:
                    out = (out + "\n" if out else "") + f"max abs error: {r.max_abs_error:.6g}"
                if out:
                    ET.SubElement(tc, "system-out").text = out
            totals["tests"] += len(rs)
            totals["failures"] += sum(r.outcome == "failed" for r in rs)
            totals["skipped"] += sum(r.outcome == "skipped" for r in rs)
        for k, v in totals.items():
            suites.set(k, str(v))
        suites.set("errors", "0")
        suites.set("time", f"{total_time:.3f}")
        ET.indent(suites)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


def write_junit(report: SmokeReport, path: Path) -> Path:
    """Write the report's JUnit XML atomically (temp file + rename); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(report.to_junit_xml(), encoding="utf-8")
    tmp.replace(path)
    return path
