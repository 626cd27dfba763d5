"""Helpers the tests of resources share (the in-process ones in ``tests/unit/resources/``,
the ones that start processes in ``tests/scenarios/resources/``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping

from metrale_orch.cli import main


def _cli(argv: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, environ=environ, out=out, err=err)
    return code, out.getvalue(), err.getvalue()
