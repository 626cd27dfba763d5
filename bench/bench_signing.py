"""S1: signed cache entries (issue 22): a warm rebuild from S3 with verification on vs off.

    python bench/bench_signing.py [OUT] [--reps 3]

One cold build of the sample tree by a signing writer (``cache_signing_key``) fills S3
(moto on this machine). Then, alternating, ``--reps`` warm rebuilds each way, every one a
fresh checkout with an empty local cache (every module a remote hit): without
``cache_trusted_keys`` (nothing checked) and with it (every entry's signature checked
before it is installed or copied into the local tier). Prints the medians and their
ratio (goal <= 1.05x), and the cost of checking one entry's signature, measured on the
objects the run fetched (decode and verify vs decode alone).

Nothing is asserted (these machines are noisy).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
from bench_parallel import env_for  # noqa: E402
from bench_remote import PY, checkout, line_of, timed  # noqa: E402

from metrale_orch.cache.local import read_object_file, scan_objects  # noqa: E402
from metrale_orch.cache.objects import decode_object  # noqa: E402
from metrale_orch.cache.signing import PublicKey, Trust, write_key_pair  # noqa: E402


def per_entry(local: Path, trusted: str, rounds: int = 200) -> tuple[int, float, float]:
    """(objects, µs to decode one, µs to decode and check its signature)."""
    blobs = [
        (e.key, read_object_file(e.path, 1 << 31) or b"") for e in scan_objects(local).objects()
    ]
    trust = Trust([PublicKey.from_line(trusted).raw])
    for key, data in blobs:  # warm: the public key loaded, the library imported
        assert trust.check(decode_object(key, data))[0] == "verified"
    start = time.perf_counter()
    for _ in range(rounds):
        for key, data in blobs:
            decode_object(key, data)
    plain = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(rounds):
        for key, data in blobs:
            trust.check(decode_object(key, data))
    checked = time.perf_counter() - start
    n = rounds * len(blobs)
    return len(blobs), plain / n * 1e6, checked / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=HERE / "out" / "signing")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    from tests.support.servers import s3_server

    key = out / "ci.pem"
    line = write_key_pair(key, "bench").line()
    with s3_server() as s3:
        remote = {
            "METRALE_ORCH_CACHE": s3.url("team"),
            "METRALE_ORCH_STORAGE_OPTIONS": json.dumps(s3.storage_options),
            "METRALE_ORCH_CACHE_MODE": "read-write",
        }
        env = env_for(out, METRALE_ORCH_LOCAL_CACHE=str(out / "cache-ci"), **remote)
        env["METRALE_ORCH_CACHE_SIGNING_KEY"] = str(key)
        cold, _ = timed([PY, "-m", "doit", "build"], checkout(out, "ci"), env)
        print(f"S1 fill: a signing writer's cold build {cold:.2f} s")
        times: dict[str, list[float]] = {"off": [], "on": []}
        for rep in range(args.reps):
            for mode in ("off", "on"):
                cache = out / f"cache-{mode}-{rep}"
                env = env_for(out, METRALE_ORCH_LOCAL_CACHE=str(cache), **remote)
                if mode == "on":
                    env["METRALE_ORCH_CACHE_TRUSTED_KEYS"] = line
                root = checkout(out, f"warm-{mode}")
                took, text = timed([PY, "-m", "doit", "build"], root, env)
                times[mode].append(took)
                cache_line = line_of(text, "cache: ")
                print(f"  rep {rep} verification {mode:<3} {took:6.2f} s  ({cache_line})")
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(
        f"S1 warm from S3, median of {args.reps}: off {off:.2f} s, on {on:.2f} s: {on / off:.3f}x"
    )
    n, plain, checked = per_entry(out / "cache-on-0", line)
    print(
        f"S1 per entry ({n} objects of the sample tree): decode {plain:.1f} µs, decode + "
        f"signature {checked:.1f} µs: {checked - plain:.1f} µs per entry for the signature"
    )


if __name__ == "__main__":
    main()
