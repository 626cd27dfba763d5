"""Sub-commands of `metrale-orch` (placeholder: filled in by its owner)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this module's sub-commands to `sub`."""
