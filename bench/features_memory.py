"""Peak memory of building one user's history: SMALL vs LARGE events of a single user.

Each build runs in a fresh child (``tests.features.skewed.build_peak``: the Parquet file read in
batches into ``stream_histories``, the training examples read back); its peak RSS is
``ru_maxrss``. ratio = peak at LARGE / peak at SMALL (target 1: memory bounded per user; here,
unlike other benches, lower is better; the memory tests accept up to 1.3).
"""

from __future__ import annotations

import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import QUICK, WORK, result, timed
from tests.features.skewed import build_peak, write_one_user

SMALL, LARGE = (200_000, 1_000_000) if QUICK else (2_000_000, 10_000_000)


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    peaks = {}
    for n in (SMALL, LARGE):
        path = WORK / f"features-one-user-{n}.parquet"
        if not path.exists():
            write_one_user(path, n)
        seen, seconds = timed(partial(build_peak, path))
        peaks[n] = seen["peak_kb"] / 1024
        print(
            f"{n} events of one user: peak {peaks[n]:.0f} MiB (before the build {seen['read_kb'] / 1024:.0f} MiB, "
            f"file {seen['file_bytes'] / 2**20:.0f} MiB), {seen['examples']} examples, {seconds:.1f} s",
            flush=True,
        )
    result(
        "features-memory",
        peaks[LARGE] / peaks[SMALL],
        1,
        f"peak RSS {peaks[SMALL]:.0f} MiB at {SMALL} events of one user, {peaks[LARGE]:.0f} MiB at {LARGE}",
    )


if __name__ == "__main__":
    main()
