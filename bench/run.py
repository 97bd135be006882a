"""Run the benchmarks: ``python bench/run.py [NAME]`` (``make bench [B=NAME]``).

Every ``bench/<name>.py`` is a script that measures the project and its baseline
in one run and prints ``RESULT <name> ratio=<r> target=<t> ...`` as its last
line, or ``SKIP <name> <why>`` and exit 0 when a part it needs is missing here (a GPU, a
service's jar). ``QUICK=1`` in the environment shrinks the inputs (about a minute each).
A bench is a script with a ``__main__`` guard; the other modules here are shared code.
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
SKIP = re.compile(r"^SKIP (\S+) (.*)$")


def _benches() -> list[str]:
    scripts = (p for p in BENCH_DIR.glob("*.py") if p.stem != "run" and 'if __name__ == "__main__"' in p.read_text())
    return sorted(p.stem for p in scripts)


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
        skips = [m.group(0) for m in map(SKIP.match, proc.stdout.splitlines()) if m]
        results.extend(skips)
        if proc.returncode != 0 or not (lines or skips):
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
