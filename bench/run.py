"""Run the benchmarks: ``python bench/run.py [NAME]`` (``make bench [B=NAME]``).

Every ``bench/<name>.py`` is a script that measures the project and its baseline
in one run and prints ``RESULT <name> ratio=<r> target=<t> ...`` as its last
line. ``QUICK=1`` in the environment shrinks the inputs (about a minute each).
This runner starts each script, streams its output and prints every RESULT line
again at the end, with PASS/MISS against its target.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULT = re.compile(r"^RESULT (\S+) ratio=([0-9.eE+-]+) target=([0-9.eE+-]+)(.*)$")


def _benches() -> list[str]:
    return sorted(p.stem for p in BENCH_DIR.glob("*.py") if p.stem not in {"run", "__init__", "common"})


def main(argv: list[str]) -> int:
    names = _benches()
    chosen = [a for a in argv if a]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"unknown bench {unknown}; choose from {names}", file=sys.stderr)
        return 2
    results: list[str] = []
    failed = False
    for name in chosen or names:
        print(f"=== bench {name}", flush=True)
        proc = subprocess.run([sys.executable, str(BENCH_DIR / f"{name}.py")], stdout=subprocess.PIPE, text=True)
        sys.stdout.write(proc.stdout)
        lines = [m for m in map(RESULT.match, proc.stdout.splitlines()) if m]
        if proc.returncode != 0 or not lines:
            failed = True
            results.append(f"ERROR {name} exit={proc.returncode}")
        for m in lines:
            verdict = "PASS" if float(m.group(2)) >= float(m.group(3)) else "MISS"
            results.append(f"{verdict} {m.group(0)}")
    print("=== summary")
    print("\n".join(results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
