"""The values of the coverage report: a problem line, a target left unchecked, the report.

Everything here is sorted and root-relative, so the JSON of two runs over the same build
is the same text; what a run cost (ptxas runs, cache hits) lives beside the report
(:class:`Coverage`), not in it. :meth:`Coverage.lines` is the report as the command and
``doit coverage`` print it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Coverage", "CoverageReport", "Problem", "Unchecked"]


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Problem:
    """One line of the gate: ``<target>: <module>: <what>``. ``target`` is a hardware's
    name for a problem of the hardware as a whole (a named module none of its targets
    builds); ``module`` is ``(target)`` for one of the target as a whole."""

    target: str
    module: str
    what: str

    def line(self) -> str:
        return f"{self.target}: {self.module}: {self.what}"

    def to_dict(self) -> dict[str, str]:
        return {"target": self.target, "module": self.module, "what": self.what}


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Unchecked:
    """A selected target the gate could not look at, and why (its toolchain is not
    installed here, or writes artefacts no reader here understands)."""

    target: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"target": self.target, "reason": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class CoverageReport:
    """What the gate found over the selected targets of one build directory."""

    #: The build directory, root-relative.
    build_dir: str
    #: Sorted.
    problems: tuple[Problem, ...]
    #: Sorted.
    unchecked: tuple[Unchecked, ...]
    #: Targets looked at (selected, less the unchecked).
    targets: int
    #: Modules whose artefact was looked at.
    modules: int
    #: (target, module, kernel) triples a family or fusion file asks of a built module.
    named: int

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        return {
            "build_dir": self.build_dir,
            "problems": [p.to_dict() for p in self.problems],
            "unchecked": [u.to_dict() for u in self.unchecked],
            "targets": self.targets,
            "modules": self.modules,
            "named": self.named,
            "ok": self.ok,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Coverage:
    """A report and what producing it cost (not part of the report: it varies run to run)."""

    report: CoverageReport
    #: ptxas processes started.
    ptxas_runs: int
    #: PTX answered from the cache.
    cache_hits: int

    def lines(self) -> list[str]:
        """Each problem, each unchecked target, then a one-line summary."""
        report = self.report
        out = [p.line() for p in report.problems]
        out += [f"{u.target}: unchecked: {u.reason}" for u in report.unchecked]
        n = len(report.problems)
        verdict = _count(n, "problem") if n else "no problem"
        out.append(
            f"coverage: {verdict}; {_count(report.targets, 'target')}, "
            f"{_count(report.modules, 'module')}, {_count(report.named, 'named kernel')} "
            f"checked, {len(report.unchecked)} unchecked; "
            f"{_count(self.ptxas_runs, 'ptxas run')}, {self.cache_hits} from the cache "
            f"({report.build_dir}/.state)"
        )
        return out


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"
