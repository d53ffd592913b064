"""Cost of ``slurm_recovery.progress.report()`` per call, as a training loop pays it.

    .venv/bin/python bench/progress_api.py [--calls 1000000] [--interval 1.0] [--quick]
                                           [--json FILE]

Cases, each ``--calls`` calls in a tight loop (best of 5 runs, nanoseconds per call):

- ``disabled``: ``SRECOVERY_PROGRESS_FILE`` unset (every call returns at once);
- ``step only`` / ``step, tokens, loss``: writing to a file in a temporary directory every
  ``--interval`` seconds (the default 1 s), so nearly every call only buffers;
- ``every call writes``: interval 0, the worst case (one JSON line and one write per call).

The target is < 20 µs per call amortised; the written line count is printed to show the
buffering. The loop itself (a bare function call) is printed as the floor.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import write_json

from slurm_recovery import progress


def per_call(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for step in range(calls):
            fn(step)
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--interval", type=float, default=progress.DEFAULT_INTERVAL)
    parser.add_argument("--quick", action="store_true", help="20,000 calls per case (for CI)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    calls = min(args.calls, 20_000) if args.quick else args.calls

    def nothing(step: int) -> None:
        return None

    rows = [("bare function call (floor)", per_call(nothing, calls), None)]

    os.environ.pop(progress.ENV_FILE, None)
    progress._reset()
    rows.append(("disabled (no SRECOVERY_PROGRESS_FILE)", per_call(progress.report, calls), None))

    with tempfile.TemporaryDirectory() as folder:
        for name, interval, fn in (
            ("step only", args.interval, lambda step: progress.report(step)),
            (
                "step, tokens, loss",
                args.interval,
                lambda step: progress.report(step, tokens=4096, loss=2.5),
            ),
            ("every call writes (interval 0)", 0.0, lambda step: progress.report(step)),
        ):
            path = Path(folder) / f"{len(rows)}.progress"
            os.environ[progress.ENV_FILE] = str(path)
            os.environ[progress.ENV_INTERVAL] = str(interval)
            progress._reset()
            n = calls if interval else max(calls // 20, 1000)
            cost = per_call(fn, n)
            progress._reset()
            with open(path, "rb") as fh:
                written = sum(1 for _ in fh)
            rows.append((f"{name}", cost, written))
    os.environ.pop(progress.ENV_FILE, None)
    os.environ.pop(progress.ENV_INTERVAL, None)
    progress._reset()

    print(f"{'case':42} {'ns/call':>10} {'lines written':>14}")
    for name, cost, written in rows:
        print(f"{name:42} {cost:10.0f} {'' if written is None else written:>14}")
    figures = {
        "calls": calls,
        "interval_s": args.interval,
        "ns_per_call": {name: round(cost, 1) for name, cost, _ in rows},
        "lines_written": {name: written for name, _, written in rows if written is not None},
    }
    write_json(args.json, "progress_api", figures, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
