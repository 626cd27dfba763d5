"""The kept answers of a tool run on artefacts (ptxas), by key: ``<build_dir>/.state/*.json``.

One memo per run of a command: loaded once (:meth:`Answers.load`), asked and filled by key,
saved when the run changed it (:meth:`Answers.save`, which also drops what the run did not
use when it saw every target). The register report and the coverage check keep theirs so.
Only a speed-up: a missing, unreadable or foreign file (not the user's own,
:func:`~metrale_orch.ownership.read_own`) or one of another schema is an empty memo; a
failed write is logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.fsutil import write_own
from metrale_orch.ownership import read_own

__all__ = ["Answers"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Answers:
    """``key -> answer`` (JSON values) kept at ``path`` under ``schema``; ``what`` names the
    memo in a warning; ``used``: the keys this run asked for."""

    path: Path
    schema: int
    what: str
    entries: dict[str, object] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    dirty: bool = False

    @classmethod
    def load(cls, path: Path, schema: int, what: str) -> Answers:
        """The memo at ``path`` (I/O); empty when it cannot be trusted or read."""
        memo = cls(path=path, schema=schema, what=what)
        try:
            doc = json.loads(read_own(path))
        except FileNotFoundError:
            return memo
        except (OSError, ValueError) as exc:
            log.warning("%s: ignoring %s (%s)", path, what, exc)
            return memo
        if isinstance(doc, dict) and doc.get("schema") == schema:
            found = doc.get("entries")
            if isinstance(found, dict):
                memo.entries = dict(found)
        return memo

    def get(self, key: str) -> object:
        """The answer kept for ``key``, or None; the key counts as used."""
        self.used.add(key)
        return self.entries.get(key)

    def put(self, key: str, answer: object) -> None:
        """Keep ``answer`` for ``key``."""
        self.entries[key] = answer
        self.dirty = True

    def save(self, *, prune: bool) -> None:
        """Write the memo when this run changed it (I/O); ``prune`` drops what it did not use."""
        if prune and self.entries.keys() - self.used:
            self.entries = {k: v for k, v in self.entries.items() if k in self.used}
            self.dirty = True
        if not self.dirty:
            return
        doc = {"schema": self.schema, "entries": self.entries}
        try:
            write_own(self.path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
        except OSError as exc:
            log.warning("%s: cannot save %s (%s)", self.path, self.what, exc)
