"""Helpers the tests of remote client share (the in-process ones in ``tests/unit/remote/``,
the ones that start processes in ``tests/scenarios/remote/``; moved from
``tests/test_remote_client.py``).
"""

from __future__ import annotations

from metrale_orch.remote import (
    InputFile,
)

SAMPLE = {
    "kernels/gemv.cu": b"__global__ void gemv() {}\n",
    "kernels/include/tile.cuh": b"#pragma once\n",
    "include/common.h": b"#define N 4\n",
    "build.sh": InputFile(b"#!/bin/sh\nexit 0\n", executable=True),
    "z": b"",
}
