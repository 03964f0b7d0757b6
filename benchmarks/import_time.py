"""Import time: ``import headway`` and the rate-limit path, beside the peers users pick.

Each statement runs in a fresh interpreter, ``--runs`` times, interleaved so that a noisy
neighbour hits every subject alike; the report is the median wall time of the
interpreter minus that of an empty one, and the median ``-X importtime`` total of the
top-level module (the interpreter's own figure, in ms). Compare within one run.

    uv run --group bench python benchmarks/import_time.py --runs 15
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

SUBJECTS = {
    "empty interpreter": "pass",
    "import headway": "import headway",
    "headway.RateLimitMiddleware": "import headway; headway.RateLimitMiddleware",
    "headway.IdempotencyMiddleware": "import headway; headway.IdempotencyMiddleware",
    "import slowapi": "import slowapi",
    "import limits.aio.strategies": "import limits.aio.strategies",
}


def _run(code: str) -> tuple[float, float]:
    """Wall seconds of one fresh interpreter running ``code``, and its importtime total."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    wall = time.perf_counter() - start
    # The line of a top-level module has no indentation before its name.
    totals = [
        int(m.group(1))
        for m in re.finditer(r"^import time:\s+\d+ \|\s+(\d+) \| (\S+)$", done.stderr, re.M)
    ]
    return wall, sum(totals) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {name: [] for name in SUBJECTS}
    imports: dict[str, list[float]] = {name: [] for name in SUBJECTS}
    for _ in range(args.runs):
        for name, code in SUBJECTS.items():
            try:
                wall, total = _run(code)
            except subprocess.CalledProcessError:  # a peer not installed: say so, go on
                continue
            walls[name].append(wall)
            imports[name].append(total)
    empty = statistics.median(walls["empty interpreter"])
    print(f"{'statement':34} {'wall - empty (ms)':>18} {'-X importtime (ms)':>19}  runs")
    for name in SUBJECTS:
        if not walls[name]:
            print(f"{name:34} {'not installed':>18}")
            continue
        wall = (statistics.median(walls[name]) - empty) * 1000
        total = statistics.median(imports[name])
        print(f"{name:34} {wall:18.0f} {total:19.0f}  {len(walls[name])}")


if __name__ == "__main__":
    main()
