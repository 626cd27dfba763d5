"""Helpers the tests of the resources area share, the in-process ones
(``tests/unit/resources/``) and the ones that start processes
(``tests/scenarios/resources/``) alike.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

from metrale_orch.cli import main


def _cli(argv: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, environ=environ, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


A, B = "h/m/a", "h/m/b"
