"""Helpers the tests of probe records share (the in-process ones in
``tests/unit/toolchain/``, the ones that start processes in ``tests/scenarios/toolchain/``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from metrale_orch.toolchain.definitions import builtin_toolchains
from tests.support.build import FAKE_NVCC, fake_toolchain_env

NVCC = builtin_toolchains()["nvcc"]

#: A gcc stand-in that logs each call and prints a ``-v`` search list over two directories
#: of the test: INC (exists) and NEW (ignored as nonexistent until a test makes it).
FAKE_GCC = f"""#!{sys.executable}
import os, sys
with open(os.environ["PROBE_LOG"], "a") as fh:
    fh.write("gcc " + " ".join(sys.argv[1:]) + "\\n")
if "-###" in sys.argv:
    print(' "/usr/lib/fake/cc1plus" -E -quiet ' + os.environ.get("FAKE_GCC_DRYRUN", ""))
elif "-Wp,-v" in sys.argv:
    new = os.environ["FAKE_GCC_NEW"]
    print('ignoring nonexistent directory "' + new + '"' if not os.path.isdir(new) else "")
    print("#include <...> search starts here:")
    for d in (os.environ["FAKE_GCC_INC"], new):
        if os.path.isdir(d):
            print(" " + d)
    print("End of search list.")
else:
    print("gcc (Fake) 12.2.0")
"""

LOGGING_NVCC = FAKE_NVCC.replace(
    "args = sys.argv[1:]\n",
    "args = sys.argv[1:]\n"
    'open(os.environ["PROBE_LOG"], "a").write("nvcc " + " ".join(args) + "\\n")\n',
    1,
)


def _setup(tmp_path: Path) -> dict[str, str]:
    env = fake_toolchain_env(tmp_path / "bin")
    (tmp_path / "bin" / "nvcc").write_text(LOGGING_NVCC)
    (tmp_path / "bin" / "gcc").write_text(FAKE_GCC)
    (tmp_path / "inc").mkdir()
    env.update(
        PROBE_LOG=str(tmp_path / "probe.log"),
        FAKE_GCC_INC=str(tmp_path / "inc"),
        FAKE_GCC_NEW=str(tmp_path / "new"),
    )
    return env
